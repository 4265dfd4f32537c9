// Cost model v2's promise: one layer per stage costs nothing extra. Store-all through a
// Checkpointable measures plain autograd's own peak on the same network, and optimal schedules
// measure their prediction, with every layer a stage.
#include <catch2/catch.hpp>
#include <string>

#include "profiler/test_nets.h"
#include "remat/runtime.h"
#include "remat/solver.h"

namespace nn = torch::nn;
using remat::Algorithm;

namespace {

// Self-attention over (batch, sequence, features), one tensor in and out: what a transformer
// block's attention layer is to the chain.
struct SelfAttentionImpl : nn::Module {
  SelfAttentionImpl(int features, int heads)
      : heads_(heads),
        qkv_(register_module("qkv", nn::Linear(features, 3 * features))),
        out_(register_module("out", nn::Linear(features, features))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const auto b = x.size(0), n = x.size(1), f = x.size(2);
    const auto parts = qkv_(x).view({b, n, 3, heads_, f / heads_}).permute({2, 0, 3, 1, 4});
    const torch::Tensor q = parts[0], k = parts[1], v = parts[2];
    const torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(f / heads_);
    const torch::Tensor mixed = torch::matmul(torch::softmax(scores, -1), v);
    return out_(mixed.transpose(1, 2).reshape({b, n, f}));
  }
  int heads_;
  nn::Linear qkv_, out_;
};
TORCH_MODULE(SelfAttention);

// Every layer a stage.
nn::Sequential per_layer_cnn() {
  nn::Sequential net;
  net->push_back(nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1).bias(false)));
  net->push_back(nn::BatchNorm2d(8));
  net->push_back(nn::ReLU());
  net->push_back(nn::Conv2d(nn::Conv2dOptions(8, 8, 3).padding(1).bias(false)));
  net->push_back(nn::BatchNorm2d(8));
  net->push_back(nn::ReLU());
  net->push_back(nn::Dropout(0.2));
  net->push_back(nn::MaxPool2d(nn::MaxPool2dOptions(2)));
  net->push_back(nn::Conv2d(nn::Conv2dOptions(8, 16, 3).padding(1).bias(false)));
  net->push_back(nn::BatchNorm2d(16));
  net->push_back(nn::ReLU());
  net->push_back(nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions({2, 2})));
  net->push_back(nn::Flatten());
  net->push_back(nn::Linear(64, 10));
  return net;
}

nn::Sequential per_layer_transformer(int features) {
  nn::Sequential net;
  net->push_back(nn::Linear(features, features));
  net->push_back(nn::LayerNorm(nn::LayerNormOptions({features})));
  net->push_back(SelfAttention(features, 4));
  net->push_back(nn::Dropout(0.1));
  net->push_back(nn::LayerNorm(nn::LayerNormOptions({features})));
  net->push_back(nn::Linear(features, 4 * features));
  net->push_back(nn::GELU());
  net->push_back(nn::Linear(4 * features, features));
  net->push_back(nn::Dropout(0.1));
  net->push_back(nn::LayerNorm(nn::LayerNormOptions({features})));
  net->push_back(nn::Linear(features, 10));
  return net;
}

// Peak activation memory of one training step with `forward` (the network or the
// Checkpointable), above what was live before it: the input (a copy of the sample, as the
// chain counts its input), forward, a loss whose gradient is a full tensor made inside the
// graph, backward. The caller's loss holds two scalars the chain does not count: its value and
// the gradient seed backward() makes for it (8 bytes).
template <class Forward>
std::int64_t step_peak(Forward forward, const torch::Tensor& sample, const torch::Tensor& weight) {
  remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(torch::kCPU);
  const std::int64_t base = tracker.live();
  tracker.reset_peak();
  {
    torch::manual_seed(5);
    const torch::Tensor x = sample.clone();
    torch::Tensor loss = (forward(x) * weight).sum();
    loss.backward();
  }
  return tracker.peak() - base;
}

}  // namespace

TEST_CASE("one layer per stage: store-all peaks as plain autograd, schedules as predicted",
          "[runtime]") {
  torch::set_num_threads(1);
  struct Case {
    std::string name;
    nn::Sequential net;
    torch::Tensor sample;
  };
  torch::manual_seed(4);
  std::vector<Case> cases;
  cases.push_back({"CNN", per_layer_cnn(), torch::randn({4, 3, 16, 16})});
  cases.push_back({"transformer", per_layer_transformer(32), torch::randn({4, 24, 32})});
  for (Case& c : cases) {
    SECTION(c.name) {
      nn::Sequential& net = c.net;
      for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
      torch::Tensor weight;
      {
        torch::NoGradGuard no_grad;
        weight = torch::ones_like(net->forward(c.sample));
      }
      const std::int64_t plain =
          step_peak([&](const torch::Tensor& x) { return net->forward(x); }, c.sample, weight);
      remat::Checkpointable chk(net);
      chk->measure(c.sample, remat::ProfileOptions().measure_time(false));
      const remat::Chain& chain = chk->chain();
      REQUIRE(chain.length() == static_cast<int>(net->size()));
      const std::int64_t kR = remat::runtime_reserve_bytes(torch::kCPU);
      const std::int64_t full = remat::store_all_peak(chain);
      // The prediction is plain autograd's peak, less the two scalars of the caller's loss.
      constexpr std::int64_t kLossScalars = 8;
      INFO(c.name << ": plain " << plain << ", predicted store-all " << full);
      CHECK(full == plain - kLossScalars);

      chk->compute_sequence(full + kR, Algorithm::kStoreAll);
      const std::int64_t store_all =
          step_peak([&](const torch::Tensor& x) { return chk->forward(x); }, c.sample, weight);
      CHECK(store_all == plain);

      const std::int64_t least = remat::min_feasible_budget(chain, remat::SolveOptions(0));
      REQUIRE(least < full);
      for (const std::int64_t budget : {least, (least + full) / 2, (least + 3 * full) / 4}) {
        const remat::Solution& s = chk->compute_sequence(budget + kR);
        REQUIRE(s.ok());
        const std::int64_t measured =
            step_peak([&](const torch::Tensor& x) { return chk->forward(x); }, c.sample, weight);
        INFO("budget " << budget << ": predicted " << s.peak_bytes << ", measured " << measured
                       << "\n"
                       << remat::collapsed_string(s.sequence));
        CHECK(measured <= budget + kR);
        CHECK(measured == s.peak_bytes + kLossScalars);
      }
    }
  }
}
