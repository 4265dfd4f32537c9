// Cost model v2's promise: one layer per stage costs nothing extra. Store-all through a
// Checkpointable measures plain autograd's own peak on the same network, and optimal schedules
// measure their prediction, with every layer a stage.
#include <catch2/catch.hpp>
#include <string>

#include "per_layer_nets.h"  // bench/: the networks the cost-model bench measures
#include "profiler/test_nets.h"
#include "remat/runtime.h"
#include "remat/solver.h"

namespace nn = torch::nn;
using remat::Algorithm;

namespace {

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
  cases.push_back({"CNN", remat::bench::per_layer_cnn(), torch::randn({4, 3, 16, 16})});
  cases.push_back(
      {"transformer", remat::bench::per_layer_transformer(32), torch::randn({4, 24, 32})});
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
      // step_peak lets the output go with the loss: measured so.
      chk->measure(c.sample, remat::ProfileOptions().measure_time(false).output_held(false));
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
        CHECK(measured == s.peak_bytes - kR + kLossScalars);  // peak_bytes includes the reserve
      }
    }
  }
}
