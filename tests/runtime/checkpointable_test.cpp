#include <catch2/catch.hpp>

#include "profiler/test_nets.h"
#include "remat/runtime.h"
#include "remat/solver.h"

namespace nn = torch::nn;
using remat::Algorithm;

namespace {

struct StepResult {
  torch::Tensor output, input_grad;
  std::vector<torch::Tensor> state;  // parameter gradients, then buffers
};

// One or more training steps (forward, loss, backward) with gradients accumulating;
// `forward` is the plain network or the Checkpointable.
template <class Forward>
StepResult train(nn::Module& net, Forward forward, const torch::Tensor& sample, int steps,
                 std::uint64_t seed) {
  torch::manual_seed(seed);
  StepResult r;
  torch::Tensor x = sample.clone().requires_grad_(true);
  for (int s = 0; s < steps; ++s) {
    torch::Tensor out = forward(x);
    torch::Tensor loss = (out * out).sum() + out.mean();
    loss.backward();
    r.output = out.detach().clone();
  }
  r.input_grad = x.grad().clone();
  for (const auto& p : net.parameters()) r.state.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  for (const auto& b : net.buffers()) r.state.push_back(b.clone());
  return r;
}

void check_equal(const StepResult& a, const StepResult& b) {
  CHECK(torch::equal(a.output, b.output));
  CHECK(torch::equal(a.input_grad, b.input_grad));
  REQUIRE(a.state.size() == b.state.size());
  for (std::size_t k = 0; k < a.state.size(); ++k) {
    INFO("state tensor " << k);
    REQUIRE(a.state[k].defined() == b.state[k].defined());
    if (a.state[k].defined()) CHECK(torch::equal(a.state[k], b.state[k]));
  }
}

// A fresh copy of `make()`'s network for each run: same initialization by seed.
template <class Make>
nn::Sequential fresh(Make make) {
  torch::manual_seed(11);
  return make();
}

}  // namespace

TEST_CASE("checkpointed training equals plain training, bit for bit", "[runtime]") {
  torch::set_num_threads(1);  // one thread: the same reduction order in both runs
  const torch::Tensor sample = torch::randn({3, 3, 16, 16});
  auto make = [] { return remat::test::conv_chain(6, 10, true); };  // BatchNorm and Dropout
  nn::Sequential reference_net = fresh(make);
  const StepResult plain = train(*reference_net, [&](const torch::Tensor& x) { return reference_net->forward(x); },
                                 sample, 2, 5);

  nn::Sequential probe = fresh(make);
  const remat::Chain chain =
      remat::profile(probe, sample, remat::ProfileOptions().measure_time(false)).chain;
  const std::int64_t full = remat::store_all_peak(chain);
  const std::int64_t least = remat::min_feasible_budget(chain, remat::SolveOptions(0));
  struct Case {
    Algorithm algorithm;
    std::int64_t budget;
  };
  const std::vector<Case> cases = {
      {Algorithm::kOptimal, least},          {Algorithm::kOptimal, (least + full) / 2},
      {Algorithm::kOptimal, full},           {Algorithm::kStoreAll, full},
      {Algorithm::kRecomputeAll, full},      {Algorithm::kPeriodic, full},
      {Algorithm::kRevolve, (least + full) / 2},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(remat::algorithm_name(c.algorithm) << " at " << c.budget << " bytes") {
      nn::Sequential net = fresh(make);
      remat::Checkpointable chk(net);
      chk->set_chain(chain);
      const remat::Solution& s = chk->compute_sequence(c.budget, c.algorithm);
      INFO(remat::collapsed_string(s.sequence));
      const StepResult ours = train(*net, [&](const torch::Tensor& x) { return chk->forward(x); }, sample, 2, 5);
      check_equal(plain, ours);
    }
  }
}

TEST_CASE("the input may or may not require grad; eval and no-grad run the plain network",
          "[runtime]") {
  torch::set_num_threads(1);
  torch::manual_seed(3);
  nn::Sequential net = remat::test::conv_chain(4, 5, false);
  const torch::Tensor sample = torch::randn({2, 3, 12, 12});
  remat::Checkpointable chk(net, sample);
  chk->compute_sequence(remat::min_feasible_budget(chk->chain(), remat::SolveOptions(0)));
  // Input without grad: parameters still get their gradients.
  torch::Tensor out = chk->forward(sample);
  CHECK(out.requires_grad());
  out.sum().backward();
  for (const auto& p : net->parameters()) CHECK(p.grad().defined());
  // Eval mode: the plain network, output without a remat node.
  chk->eval();
  torch::Tensor eval_out = chk->forward(sample);
  CHECK(torch::equal(eval_out, net->forward(sample)));
  chk->train();
  {
    torch::NoGradGuard no_grad;
    CHECK_FALSE(chk->forward(sample).requires_grad());
  }
}

TEST_CASE("Checkpointable reports misuse clearly", "[runtime]") {
  nn::Sequential net = remat::test::conv_chain(4, 5, false);
  remat::Checkpointable chk(net);
  CHECK_THROWS_WITH(chk->compute_sequence(1 << 20), Catch::Contains("no chain yet"));
  CHECK_THROWS_WITH(chk->forward(torch::randn({2, 3, 8, 8})), Catch::Contains("compute_sequence"));
  chk->measure(torch::randn({2, 3, 8, 8}), remat::ProfileOptions().measure_time(false));
  CHECK_THROWS_WITH(chk->compute_sequence(10), Catch::Contains("needs at least"));
  remat::Chain wrong = chk->chain();
  wrong.stages.pop_back();
  CHECK_THROWS_WITH(chk->set_chain(wrong), Catch::Contains("stages but the network"));
}
