#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <catch2/catch.hpp>
#include <map>
#include <string>

#include "profiler/test_nets.h"
#include "remat/runtime.h"
#include "remat/solver.h"
#include "skip.h"

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

// `with torch.autocast(device, dtype)` in C++, with the API of the LibTorch at hand (2.4 gave
// the functions a device-type argument and deprecated the old ones).
// Its own, not runtime/src/autocast.h's: the reference must not be set by the code it checks.
class AutocastScope {
 public:
  AutocastScope(c10::DeviceType device, c10::ScalarType dtype) : device_(device) {
    set(true, dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set(false, device_ == c10::kCPU ? c10::kBFloat16 : c10::kHalf);
  }

 private:
  void set(bool on, c10::ScalarType dtype) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(device_, on);
    at::autocast::set_autocast_dtype(device_, dtype);
#else
    if (device_ == c10::kCPU) {
      at::autocast::set_cpu_enabled(on);
      at::autocast::set_autocast_cpu_dtype(dtype);
    } else {
      at::autocast::set_enabled(on);
      at::autocast::set_autocast_gpu_dtype(dtype);
    }
#endif
  }
  c10::DeviceType device_;
};

// `forward`, each call inside `with torch.autocast(device, dtype)`.
template <class Forward>
auto under_autocast(c10::DeviceType device, c10::ScalarType dtype, Forward forward) {
  return [=](const torch::Tensor& x) {
    const AutocastScope scope(device, dtype);
    return forward(x);
  };
}

// The chain of `net`, measured on `sample` (which wants its gradient, as train() trains) under
// autocast, as the steps will run.
remat::Chain profile_under_autocast(nn::Sequential& net, const torch::Tensor& sample,
                                    c10::DeviceType device, c10::ScalarType dtype,
                                    const remat::ProfileOptions& options) {
  const AutocastScope scope(device, dtype);
  return remat::profile(net, sample.clone().requires_grad_(true), options).chain;
}

// Steps whose forward runs under autocast and whose backward (the recomputations) does not,
// as torch.autocast's documentation has users write them: gradients, BatchNorm statistics
// and dropout masks equal plain autocast training's, at the least budget and between.
void check_autocast_training(const torch::Device& device, c10::ScalarType dtype) {
  const torch::Tensor sample = torch::randn({4, 3, 16, 16}).to(device);
  auto make = [&] {
    nn::Sequential net = remat::test::conv_chain(8, 10, true, device.is_cuda() ? 1 : 2);
    net->to(device);
    return net;
  };
  nn::Sequential reference_net = fresh(make);
  auto plain_forward = [&](const torch::Tensor& x) { return reference_net->forward(x); };
  const StepResult plain = train(*reference_net, under_autocast(device.type(), dtype, plain_forward),
                                 sample, 2, 5);
  CHECK(plain.output.scalar_type() == dtype);  // autocast did run

  nn::Sequential probe = fresh(make);
  const remat::Chain chain = profile_under_autocast(probe, sample, device.type(), dtype,
                                                    remat::ProfileOptions().measure_time(false));
  const std::int64_t kR = remat::runtime_reserve_bytes(device);
  const std::int64_t full = remat::store_all_peak(chain) + kR;
  const std::int64_t least = remat::min_feasible_budget(chain, remat::SolveOptions(0)) + kR;
  for (const std::int64_t budget : {least, (least + full) / 2}) {
    DYNAMIC_SECTION("at " << budget << " bytes") {
      nn::Sequential net = fresh(make);
      remat::Checkpointable chk(net);
      chk->set_chain(chain);
      const remat::Solution& s = chk->compute_sequence(budget);
      INFO(remat::collapsed_string(s.sequence));
      CHECK(s.sequence.size() > 2 * chain.stages.size() + 1);  // something is recomputed
      auto remat_forward = [&](const torch::Tensor& x) { return chk->forward(x); };
      const StepResult ours =
          train(*net, under_autocast(device.type(), dtype, remat_forward), sample, 2, 5);
      check_equal(plain, ours);
    }
  }
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
  // Measured with an input that wants its gradient, as train() trains.
  const remat::Chain chain =
      remat::profile(probe, sample.clone().requires_grad_(true),
                     remat::ProfileOptions().measure_time(false))
          .chain;
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
      const remat::Solution& s = chk->compute_sequence(c.budget + remat::runtime_reserve_bytes(torch::kCPU), c.algorithm);
      INFO(remat::collapsed_string(s.sequence));
      const StepResult ours = train(*net, [&](const torch::Tensor& x) { return chk->forward(x); }, sample, 2, 5);
      check_equal(plain, ours);
    }
  }
}

// Scales its input by a running average of it, which it updates first and then reads (as an
// exponential moving average, or spectral norm's power iteration, does).
struct AverageScaleImpl : nn::Module {
  torch::Tensor average;
  explicit AverageScaleImpl(std::int64_t n) {
    average = register_buffer("average", torch::ones({n}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    {
      torch::NoGradGuard no_grad;
      average.mul_(0.5).add_(x.mean(0), 0.5);
    }
    return x * average;
  }
};
TORCH_MODULE(AverageScale);

namespace {

// A stage that updates a buffer and then reads it: its recomputation must start from the
// buffer's value before the first forward (a user's trial found 7 of 12 gradients wrong by up to
// 0.017 when it started from the value after), and end with the value after.
void check_buffers_read_after_update(const torch::Device& device) {
  const torch::Tensor sample = torch::randn({5, 8}).to(device);
  auto make = [&] {
    nn::Sequential net;
    for (int k = 0; k < 4; ++k) {
      net->push_back(nn::Linear(8, 8));
      net->push_back(AverageScale(8));
      net->push_back(nn::Tanh());
    }
    net->to(device);
    return net;
  };
  nn::Sequential reference_net = fresh(make);
  const StepResult plain = train(
      *reference_net, [&](const torch::Tensor& x) { return reference_net->forward(x); }, sample, 2,
      5);
  nn::Sequential probe = fresh(make);
  const remat::Chain chain = remat::profile(probe, sample.clone().requires_grad_(true),
                                            remat::ProfileOptions().measure_time(false))
                                 .chain;
  const std::int64_t full = remat::store_all_peak(chain) + remat::runtime_reserve_bytes(device);
  for (const Algorithm algorithm : {Algorithm::kRecomputeAll, Algorithm::kPeriodic}) {
    DYNAMIC_SECTION(remat::algorithm_name(algorithm)) {
      nn::Sequential net = fresh(make);
      remat::Checkpointable chk(net);
      chk->set_chain(chain);
      const remat::Solution& s = chk->compute_sequence(full, algorithm);
      INFO(remat::collapsed_string(s.sequence));
      const StepResult ours = train(
          *net, [&](const torch::Tensor& x) { return chk->forward(x); }, sample, 2, 5);
      check_equal(plain, ours);
    }
  }
}

}  // namespace

TEST_CASE("a recomputation reads the buffers the stage's first forward read", "[runtime]") {
  torch::set_num_threads(1);
  check_buffers_read_after_update(torch::kCPU);
}

// A BatchNorm whose forward first records the settings it runs with (its momentum, -1 for
// a cumulative average; whether it counts the batch), and can be made to fail at a given call.
// `extra` gives the stage a buffer that is not a BatchNorm statistic.
struct NormProbeImpl : nn::Module {
  struct Seen {
    double momentum;
    bool counts;
  };
  nn::BatchNorm1d norm{nullptr};
  std::vector<Seen>* seen;
  int* fail_in;  // counts down at each forward; throws when it reaches 0
  NormProbeImpl(std::int64_t n, bool cumulative, bool extra, std::vector<Seen>* seen_, int* fail_in_)
      : seen(seen_), fail_in(fail_in_) {
    nn::BatchNorm1dOptions options(n);
    if (cumulative) options.momentum(c10::nullopt);
    norm = register_module("norm", nn::BatchNorm1d(options));
    if (extra) register_buffer("extra", torch::ones({n}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto& momentum = norm->options.momentum();
    seen->push_back({momentum.has_value() ? *momentum : -1.0, norm->num_batches_tracked.defined()});
    if (*fail_in > 0 && --*fail_in == 0) throw std::runtime_error("the probe fails, as asked");
    return norm(x);
  }
};
TORCH_MODULE(NormProbe);

TEST_CASE("a recomputation freezes its stage's BatchNorms: no copies, statistics as plain "
          "training's", "[runtime]") {
  torch::set_num_threads(1);
  const torch::Tensor sample = torch::randn({6, 8});
  std::vector<NormProbeImpl::Seen> seen;
  int fail_in = 0;
  struct Variant {
    const char* name;
    bool cumulative, eval, extra, frozen;
  };
  for (const Variant v : {Variant{"momentum 0.1", false, false, false, true},
                          Variant{"a cumulative average", true, false, false, true},
                          Variant{"eval mode", false, true, false, true},
                          Variant{"another buffer in the stage: copies", false, false, true, false}}) {
    DYNAMIC_SECTION(v.name) {
      const double momentum = v.cumulative ? -1.0 : 0.1;
      auto make = [&] {
        nn::Sequential net;
        for (int k = 0; k < 4; ++k) {
          net->push_back(nn::Linear(8, 8));
          net->push_back(NormProbe(8, v.cumulative, v.extra, &seen, &fail_in));
          net->push_back(nn::Tanh());
        }
        if (v.eval) net->eval();
        return net;
      };
      nn::Sequential reference_net = fresh(make);
      const int steps = 3;
      const StepResult plain = train(
          *reference_net, [&](const torch::Tensor& x) { return reference_net->forward(x); },
          sample, steps, 5);
      nn::Sequential probe = fresh(make);
      const remat::Chain chain = remat::profile(probe, sample.clone().requires_grad_(true),
                                                remat::ProfileOptions().measure_time(false))
                                     .chain;
      nn::Sequential net = fresh(make);
      remat::Checkpointable chk(net);
      chk->set_chain(chain);
      chk->compute_sequence(remat::store_all_peak(chain) + remat::runtime_reserve_bytes(torch::kCPU),
                            Algorithm::kRecomputeAll);
      seen.clear();
      const StepResult ours =
          train(*net, [&](const torch::Tensor& x) { return chk->forward(x); }, sample, steps, 5);
      check_equal(plain, ours);  // the statistics and num_batches_tracked included
      int as_set = 0, frozen = 0;
      for (const NormProbeImpl::Seen& s : seen) {
        as_set += s.momentum == momentum && s.counts;
        frozen += s.momentum == 0.0 && !s.counts;
      }
      CHECK(as_set + frozen == static_cast<int>(seen.size()));
      if (v.frozen) {
        // Each BatchNorm's first forward of each step as set, every recomputation frozen.
        CHECK(as_set == 4 * steps);
        CHECK(frozen > 0);
      } else {
        CHECK(frozen == 0);
        CHECK(as_set > 4 * steps);
      }
      // As set again after the steps.
      for (const auto& m : net->modules())
        if (const auto* norm = m->as<nn::BatchNorm1d>()) {
          CHECK(norm->options.momentum().has_value() == !v.cumulative);
          CHECK(norm->num_batches_tracked.defined());
        }
    }
  }
}

TEST_CASE("a recomputation that fails leaves its stage's BatchNorms as they were set",
          "[runtime]") {
  torch::set_num_threads(1);
  const torch::Tensor sample = torch::randn({6, 8});
  std::vector<NormProbeImpl::Seen> seen;
  int fail_in = 0;
  nn::Sequential net;
  for (int k = 0; k < 4; ++k) {
    net->push_back(nn::Linear(8, 8));
    net->push_back(NormProbe(8, false, false, &seen, &fail_in));
  }
  remat::Checkpointable chk(net);
  chk->measure(sample.clone().requires_grad_(true), remat::ProfileOptions().measure_time(false));
  chk->compute_sequence(chk->store_all_peak(), Algorithm::kRecomputeAll);
  seen.clear();
  fail_in = 6;  // four in the forward; the second recomputation
  torch::Tensor out = chk->forward(sample.clone().requires_grad_(true));
  CHECK_THROWS_WITH(out.sum().backward(), Catch::Contains("the probe fails, as asked"));
  REQUIRE(seen.size() == 6);
  CHECK(seen[5].momentum == 0.0);  // it failed frozen
  for (const auto& m : net->modules())
    if (const auto* norm = m->as<nn::BatchNorm1d>()) {
      CHECK(norm->options.momentum() == c10::optional<double>(0.1));
      CHECK(norm->num_batches_tracked.defined());
    }
  // And the next step runs.
  CHECK_NOTHROW(chk->forward(sample.clone().requires_grad_(true)).sum().backward());
}

TEST_CASE("under autocast, recomputations run as the forward did: bfloat16 on the CPU",
          "[runtime]") {
  torch::set_num_threads(1);
  check_autocast_training(torch::kCPU, c10::kBFloat16);
}

TEST_CASE("under autocast, a weight cast without autograd is not served to a forward with it",
          "[runtime]") {
  // Before PyTorch 2.2, autocast's cache served a weight's cast made without autograd to a later
  // forward with autograd in the same autocast region (remat/core/autocast_cache.h). One Linear
  // used by three stages, and a bfloat16 region around the whole forward: a stage run without
  // autograd (CF, Fn) before another runs with it (Fe) made that one lose its share of the
  // weight's gradient (seen against LibTorch 1.13). Without buffers, the state is the
  // parameter gradients.
  torch::set_num_threads(1);
  const torch::Tensor sample = torch::randn({8, 16});
  auto make = [] {
    nn::Linear shared(16, 16);
    return nn::Sequential(shared, nn::Tanh(), shared, nn::Tanh(), shared, nn::Tanh(),
                          nn::Linear(16, 4));
  };
  nn::Sequential reference_net = fresh(make);
  auto plain_forward = [&](const torch::Tensor& x) { return reference_net->forward(x); };
  const StepResult plain = train(
      *reference_net, under_autocast(c10::kCPU, c10::kBFloat16, plain_forward), sample, 2, 5);
  CHECK(plain.output.scalar_type() == c10::kBFloat16);

  nn::Sequential probe = fresh(make);
  remat::Chain chain;
  REQUIRE_NOTHROW(chain = profile_under_autocast(probe, sample, c10::kCPU, c10::kBFloat16,
                                                 remat::ProfileOptions().repeat(1).warmup(0)));
  const std::int64_t kR = remat::runtime_reserve_bytes(torch::kCPU);
  const std::int64_t full = remat::store_all_peak(chain) + kR;
  const std::int64_t least = remat::min_feasible_budget(chain, remat::SolveOptions(0)) + kR;
  bool fn_before_fe = false;  // of the shared weight's stages, in the forward phase
  for (const std::int64_t budget : {least, (least + full) / 2, full}) {
    INFO("at " << budget << " bytes");
    nn::Sequential net = fresh(make);
    remat::Checkpointable chk(net);
    chk->set_chain(chain);
    const remat::Solution& s = chk->compute_sequence(budget);
    REQUIRE(s.ok());
    INFO(remat::collapsed_string(s.sequence));
    bool no_grad_seen = false;
    for (const remat::Op& op : s.sequence) {
      if (op.kind == remat::OpKind::kLoss) break;
      if (op.stage > 4 || op.stage % 2 != 0) continue;  // the stages of the shared Linear
      if (op.kind == remat::OpKind::kForwardNoGrad || op.kind == remat::OpKind::kForwardCheckpoint)
        no_grad_seen = true;
      if (op.kind == remat::OpKind::kForwardGrad && no_grad_seen) fn_before_fe = true;
    }
    auto remat_forward = [&](const torch::Tensor& x) { return chk->forward(x); };
    const StepResult ours =
        train(*net, under_autocast(c10::kCPU, c10::kBFloat16, remat_forward), sample, 2, 5);
    CHECK(torch::equal(plain.output, ours.output));
    CHECK(torch::equal(plain.input_grad, ours.input_grad));
    // Plain training casts the shared weight once, for its three uses, and sums their
    // gradients in bfloat16 before the cast's backward; remat casts it again where it
    // recomputes a stage, so the sums group otherwise: equal within bfloat16's rounding (a
    // few 2^-8 of the largest), where a lost use would be a third of the gradient.
    REQUIRE(plain.state.size() == ours.state.size());
    for (std::size_t k = 0; k < plain.state.size(); ++k) {
      INFO("parameter gradient " << k);
      const double scale = plain.state[k].abs().max().item<double>();
      CHECK((plain.state[k] - ours.state[k]).abs().max().item<double>() <= 0.02 * scale);
    }
  }
  CHECK(fn_before_fe);  // the case that lost gradients was among those run
}

TEST_CASE("a chain measured under autocast is refused for steps without it", "[runtime]") {
  // Measured in bfloat16, run in float32: twice the activations the schedule planned for.
  const torch::Tensor sample = torch::randn({2, 3, 8, 8});
  nn::Sequential net = remat::test::conv_chain(4, 5, false);
  remat::Checkpointable chk(net);
  {
    const AutocastScope scope(c10::kCPU, c10::kBFloat16);
    chk->measure(sample, remat::ProfileOptions().measure_time(false));
  }
  REQUIRE(chk->compute_sequence(chk->store_all_peak()).ok());
  CHECK_THROWS_WITH(chk->forward(sample.clone()),
                    Catch::Contains("the chain was measured under autocast (BFloat16) but this "
                                    "step runs without autocast"));
  {
    const AutocastScope scope(c10::kCPU, c10::kBFloat16);
    CHECK_NOTHROW(chk->forward(sample.clone()).to(torch::kFloat).sum().backward());
  }
  // Measured in float32 and run under autocast: smaller than planned, allowed.
  chk->measure(sample, remat::ProfileOptions().measure_time(false));
  REQUIRE(chk->compute_sequence(chk->store_all_peak()).ok());
  const AutocastScope scope(c10::kCPU, c10::kBFloat16);
  CHECK_NOTHROW(chk->forward(sample.clone()).to(torch::kFloat).sum().backward());
}

TEST_CASE("the input may or may not require grad, and eval and no-grad run the plain network",
          "[runtime]") {
  torch::set_num_threads(1);
  torch::manual_seed(3);
  nn::Sequential net = remat::test::conv_chain(4, 5, false);
  const torch::Tensor sample = torch::randn({2, 3, 12, 12});
  remat::Checkpointable chk(net, sample);
  chk->compute_sequence(remat::min_feasible_budget(chk->chain(), remat::SolveOptions(0)) +
                        remat::runtime_reserve_bytes(torch::kCPU));
  // Input without grad: parameters still get their gradients.
  torch::Tensor out = chk->forward(sample);
  CHECK(out.requires_grad());
  // An input that wants its gradient, when the chain was measured without one: refused, since
  // that gradient is not in the budget.
  CHECK_THROWS_WITH(chk->forward(sample.clone().requires_grad_(true)),
                    Catch::Contains("the input requires grad but the chain was measured with an "
                                    "input that does not (its gradient, 3456 bytes"));
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
  // An infeasible budget is a status, with the least budget, the runtime's reserve included;
  // forward() then refuses to train, naming it.
  const std::int64_t kR = remat::runtime_reserve_bytes(torch::kCPU);
  const std::int64_t least = remat::min_feasible_budget(chk->chain(), remat::SolveOptions(0)) + kR;
  CHECK(chk->min_budget() == least);
  for (const std::int64_t budget : {std::int64_t{10}, least - 1}) {
    const remat::Solution& s = chk->compute_sequence(budget);
    CHECK(s.status == remat::SolveStatus::kInfeasible);
    CHECK(s.budget_bytes == budget);
    CHECK(s.min_feasible_budget_bytes == least);
    CHECK(s.sequence.empty());
    CHECK_FALSE(chk->has_sequence());
    CHECK_THROWS_WITH(chk->forward(torch::randn({2, 3, 8, 8}).requires_grad_(true)),
                      Catch::Contains("found no schedule") &&
                          Catch::Contains("needs at least " + std::to_string(least)));
  }
  CHECK(chk->compute_sequence(least).ok());
  CHECK(chk->has_sequence());
  CHECK(chk->solution().peak_bytes <= least);
  // Store-all at 100% of its own reported peak runs; a byte less does not.
  const std::int64_t full = chk->store_all_peak();
  CHECK(full == remat::store_all_peak(chk->chain()) + kR);
  CHECK(chk->compute_sequence(full, Algorithm::kStoreAll).ok());
  CHECK(chk->solution().peak_bytes == full);
  CHECK(chk->compute_sequence(full - 1, Algorithm::kStoreAll).min_feasible_budget_bytes == full);
  CHECK_FALSE(chk->compute_sequence(full - 1, Algorithm::kStoreAll).ok());
  CHECK(chk->compute_sequence(full).peak_bytes == full);  // optimal: store-all too
  // A model converted to double after measure() would run over the budget: refused, naming
  // both dtypes; so are other devices and input counts.
  net->to(torch::kDouble);
  CHECK_THROWS_WITH(
      chk->forward(torch::randn({2, 3, 8, 8}, torch::kDouble)),
      Catch::Contains("the input is Double on cpu but the chain was measured with Float on cpu"));
  // With a float32 input: the parameters themselves differ from the chain's.
  CHECK_THROWS_WITH(
      chk->forward(torch::randn({2, 3, 8, 8})),
      Catch::Contains("stage 0 (0:Block)'s parameter 0 is Double 4x3x3x3 on cpu, trained, "
                      "but Float 4x3x3x3 on cpu, trained when the chain was measured"));
  net->to(torch::kFloat);
  CHECK_NOTHROW(chk->forward(torch::randn({2, 3, 8, 8})).sum().backward());
  // A parameter unfrozen since it was measured (its stage's output had a gradient already:
  // nothing else tells) is refused; one frozen since runs (fine-tuning freezes as it goes).
  net[1]->parameters()[0].requires_grad_(false);
  chk->measure(torch::randn({2, 3, 8, 8}), remat::ProfileOptions().measure_time(false));
  REQUIRE(chk->compute_sequence(chk->store_all_peak()).ok());
  net[1]->parameters()[0].requires_grad_(true);
  CHECK_THROWS_WITH(chk->forward(torch::randn({2, 3, 8, 8})),
                    Catch::Contains("stage 1 (") && Catch::Contains("trained, but") &&
                        Catch::Contains("frozen when the chain was measured"));
  net[1]->parameters()[0].requires_grad_(false);
  net[0]->parameters()[0].requires_grad_(false);
  CHECK_NOTHROW(chk->forward(torch::randn({2, 3, 8, 8})).sum().backward());
  net[0]->parameters()[0].requires_grad_(true);
  net[1]->parameters()[0].requires_grad_(true);
  // An input with fewer dimensions is said so, not called larger.
  CHECK_THROWS_WITH(chk->forward(torch::randn({3, 8, 8})),
                    Catch::Contains("the input is 3x8x8 (3 dimensions) but the chain was measured "
                                    "with 2x3x8x8 (4 dimensions)"));
  CHECK_THROWS_WITH(chk->forward(remat::Tensors{torch::randn({2, 3, 8, 8}), torch::randn({2})}),
                    Catch::Contains("2 input tensors, but the chain's input has 1 member"));
  CHECK_THROWS_WITH(
      chk->forward(remat::Tensors{torch::randn({2, 3, 8, 8})}, remat::Tensors{torch::ones({2})}),
      Catch::Contains("1 context tensor, but measure() was given 0"));
  remat::Chain wrong = chk->chain();
  wrong.stages.pop_back();
  CHECK_THROWS_WITH(chk->set_chain(wrong), Catch::Contains("stages but the network"));
  remat::Chain renamed = chk->chain();
  renamed.stages[1].name = "head";
  CHECK_THROWS_WITH(chk->set_chain(renamed),
                    Catch::Contains("stage 1 is named 'head' in the chain but '1:"));
}

constexpr bool kParameterEdges =
    TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1);

// A backward asked for some tensors only (autograd::grad, backward's inputs) gets plain
// autograd's gradients and writes no .grad; what a checkpointed backward cannot give is
// refused, never given wrong: a differentiable backward (create_graph), a gradient the chain
// was not measured with (a parameter unfrozen after measure()).
TEST_CASE("backward calls for some tensors are exact, those the schedule cannot serve refused",
          "[runtime]") {
  torch::manual_seed(0);
  nn::Sequential net(nn::Linear(8, 16), nn::Tanh(), nn::Linear(16, 16), nn::Tanh(),
                     nn::Linear(16, 2));
  remat::Checkpointable chk(net);
  const torch::Tensor x = torch::randn({4, 8}).requires_grad_(true);
  chk->measure(x, remat::ProfileOptions().measure_time(false));
  const std::vector<torch::Tensor> params = net->parameters();
  const auto plain_loss = [&] { return net->forward(x).pow(2).sum(); };
  const auto clear = [&] {
    for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
    x.mutable_grad() = torch::Tensor();
  };
  // Store-all, recomputation of all (every forward with autograd runs in the backward phase)
  // and the least budget's schedule.
  for (const Algorithm algorithm :
       {Algorithm::kStoreAll, Algorithm::kRecomputeAll, Algorithm::kOptimal}) {
    INFO(remat::algorithm_name(algorithm));
    REQUIRE(chk->compute_sequence(algorithm == Algorithm::kOptimal ? chk->min_budget()
                                                                  : chk->store_all_peak(),
                                  algorithm)
                .ok());
    clear();
    const auto ours = [&] { return chk->forward(x).pow(2).sum(); };
    // Of the input, of the parameters, of both: plain's, bit for bit, and no .grad written.
    // Before LibTorch 2.1 the parameters' gradients cannot be asked for (their accumulators'
    // hooks cannot all be seen: docs/runtime.md): torch's own refusal.
    if (!kParameterEdges)
      CHECK_THROWS_WITH(torch::autograd::grad({ours()}, params),
                        Catch::Contains("appears to not have been used in the graph"));
    for (int asked = 0; asked < (kParameterEdges ? 3 : 1); ++asked) {
      const std::vector<torch::Tensor> of =
          asked == 0 ? std::vector<torch::Tensor>{x}
          : asked == 1 ? params
                       : std::vector<torch::Tensor>{params[2], x, params[0]};
      const std::vector<torch::Tensor> expected = torch::autograd::grad({plain_loss()}, of);
      const std::vector<torch::Tensor> got = torch::autograd::grad({ours()}, of);
      REQUIRE(got.size() == expected.size());
      for (std::size_t k = 0; k < got.size(); ++k) CHECK(torch::equal(got[k], expected[k]));
      for (auto& p : net->parameters()) CHECK_FALSE(p.grad().defined());
      CHECK_FALSE(x.grad().defined());
    }
    // backward with inputs: only those get .grad, as plain's.
    const std::vector<torch::Tensor> inputs =
        kParameterEdges ? std::vector<torch::Tensor>{params[2], x} : std::vector<torch::Tensor>{x};
    torch::autograd::backward({plain_loss()}, {}, {}, false, inputs);
    const torch::Tensor expected_weight = kParameterEdges ? params[2].grad().clone() : torch::Tensor();
    const torch::Tensor expected_x = x.grad().clone();
    clear();
    torch::autograd::backward({ours()}, {}, {}, false, inputs);
    if (kParameterEdges) CHECK(torch::equal(params[2].grad(), expected_weight));
    CHECK(torch::equal(x.grad(), expected_x));
    for (std::size_t k = 0; k < params.size(); ++k)
      if (k != 2 || !kParameterEdges) CHECK_FALSE(params[k].grad().defined());
    clear();
    CHECK_THROWS_WITH(
        chk->forward(x).sum().backward({}, true, true),
        Catch::Contains("a backward that makes a graph of the gradients (create_graph)"));
    for (auto& p : net->parameters()) CHECK_FALSE(p.grad().defined());
    // A whole backward still runs, exactly as plain.
    plain_loss().backward();
    std::vector<torch::Tensor> plain_grads;
    for (auto& p : net->parameters()) plain_grads.push_back(p.grad().clone());
    clear();
    ours().backward();
    for (std::size_t k = 0; k < params.size(); ++k)
      CHECK(torch::equal(params[k].grad(), plain_grads[k]));
    clear();
  }
  // Measured with the first Linear frozen, then unfrozen: its gradient would be lost.
  torch::Tensor detached = x.detach();
  for (auto& p : net[0]->parameters()) p.requires_grad_(false);
  chk->measure(detached, remat::ProfileOptions().measure_time(false));
  REQUIRE(chk->compute_sequence(chk->store_all_peak()).ok());
  for (auto& p : net[0]->parameters()) p.requires_grad_(true);
  CHECK_THROWS_WITH(chk->forward(detached),
                    Catch::Contains("stage 0 (0:Linear)'s parameter 0 is Float 16x8 on cpu, "
                                    "trained, but Float 16x8 on cpu, frozen when the chain was "
                                    "measured") &&
                        Catch::Contains("measure() (or set_chain) again"));
  // The same chain set while the parameter is trained (set_chain cannot know what it was
  // measured with): the runtime still finds the gradient the chain does not have.
  const remat::Chain frozen_chain = chk->chain();
  chk->set_chain(frozen_chain);
  REQUIRE(chk->compute_sequence(chk->store_all_peak()).ok());
  CHECK_THROWS_WITH(
      chk->forward(detached),
      Catch::Contains("stage 0 (0:Linear) output member 0 requires grad, but it did not "
                      "when the chain was measured") &&
          Catch::Contains("measure() again"));
  chk->measure(detached, remat::ProfileOptions().measure_time(false));
  REQUIRE(chk->compute_sequence(chk->store_all_peak()).ok());
  for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
  chk->forward(detached).sum().backward();
  CHECK(net[0]->as<nn::Linear>()->weight.grad().defined());
}

// Whose fault an error is shows in its type, as in LibTorch: c10::ValueError for bad input
// (Python's ValueError, `remat`'s exit 2), a plain c10::Error for a call out of order, and the
// solver's std::invalid_argument arrives as a c10::ValueError too.
TEST_CASE(
    "an input or parameter changed in place before the backward is refused, as plain "
    "autograd refuses it",
    "[runtime]") {
  // The recomputations would read the new values: gradients silently wrong (a user's trial:
  // 2.4 off), where plain autograd raises.
  nn::Sequential net = remat::test::conv_chain(4, 5, false);
  remat::Checkpointable chk(net);
  const torch::Tensor sample = torch::randn({2, 3, 8, 8});
  chk->measure(sample, remat::ProfileOptions().measure_time(false));
  REQUIRE(chk->compute_sequence(chk->min_budget()).ok());
  {
    torch::Tensor x = sample.clone();
    torch::Tensor loss = chk->forward(x).sum();
    x.fill_(0.5);
    CHECK_THROWS_WITH(loss.backward(),
                      Catch::Contains("remat runtime: the input was modified by an inplace "
                                      "operation between the forward and the backward (it is at "
                                      "version 1; expected version 0)"));
  }
  {
    torch::Tensor loss = chk->forward(sample).sum();
    {
      torch::NoGradGuard no_grad;
      net[1]->parameters()[0].add_(1);
    }
    CHECK_THROWS_WITH(loss.backward(),
                      Catch::Contains("stage 1 (") &&
                          Catch::Contains("'s parameter 0 was modified by an inplace operation"));
  }
  // Untouched, the next step runs.
  CHECK_NOTHROW(chk->forward(sample).sum().backward());
}

TEST_CASE("Checkpointable's errors are LibTorch's, typed by whose fault they are", "[runtime]") {
  nn::Sequential net = remat::test::conv_chain(4, 5, false);
  remat::Checkpointable chk(net);
  const auto is_value_error = [](auto&& call) {
    try {
      call();
    } catch (const c10::ValueError& error) {
      return std::string("value: ") + error.what_without_backtrace();
    } catch (const c10::Error& error) {
      return std::string("error: ") + error.what_without_backtrace();
    } catch (const std::exception& error) {
      return std::string("other: ") + error.what();
    }
    return std::string("no exception");
  };
  // Out of order: no chain yet, no sequence yet.
  CHECK_THAT(is_value_error([&] { chk->compute_sequence(1 << 20); }),
             Catch::StartsWith("error: ") && Catch::Contains("no chain yet"));
  CHECK_THAT(is_value_error([&] {
               chk->forward(torch::randn({2, 3, 8, 8}));
             }),
             Catch::StartsWith("error: ") && Catch::Contains("compute_sequence"));
  chk->measure(torch::randn({2, 3, 8, 8}), remat::ProfileOptions().measure_time(false));
  // Bad input: a negative budget, bad solver options, a wrong dtype, a broken chain file.
  CHECK_THAT(is_value_error([&] { chk->compute_sequence(-1); }),
             Catch::StartsWith("value: ") && Catch::Contains("negative budget (-1 bytes)"));
  CHECK_THAT(is_value_error([&] { chk->compute_sequence(remat::SolveOptions(1 << 20).slots(-3)); }),
             Catch::StartsWith("value: ") && Catch::Contains("slots"));
  CHECK_THAT(is_value_error([&] { chk->min_budget(remat::SolveOptions(0).slots(-3)); }),
             Catch::StartsWith("value: ") && Catch::Contains("slots"));
  chk->compute_sequence(chk->store_all_peak());
  CHECK_THAT(is_value_error([&] {
               chk->forward(torch::randn({2, 3, 8, 8}, torch::kDouble));
             }),
             Catch::StartsWith("value: ") && Catch::Contains("Double"));
  remat::Chain broken = chk->chain();
  broken.stages[1].fwd_ms = -1;
  CHECK_THAT(is_value_error([&] { chk->set_chain(broken); }),
             Catch::StartsWith("value: ") && Catch::Contains("stages[1]"));
  // A profiling error is a remat::InputError: a c10::ValueError whose what() is the message
  // alone, without LibTorch's C++ backtrace.
  try {
    remat::profile(net, torch::Tensor(), remat::ProfileOptions().measure_time(false));
    FAIL("an undefined sample was accepted");
  } catch (const c10::ValueError& error) {
    CHECK(dynamic_cast<const remat::ProfileError*>(&error) != nullptr);
    CHECK_THAT(error.what(), Catch::StartsWith(error.what_without_backtrace()));
    CHECK_THAT(error.what(), !Catch::Contains("Exception raised from"));
  }
}

namespace {

// Tanh, until told to fail: then its next forward throws a c10::Error, as a LibTorch operation
// given something it cannot take would.
struct FailingTanhImpl : nn::Module {
  int fail_at = -1;  // the forward (counted from 0 since set) that throws; -1: none
  int calls = 0;
  torch::Tensor forward(const torch::Tensor& x) {
    TORCH_CHECK(calls++ != fail_at, "the stage's own error");
    return torch::tanh(x);
  }
};
TORCH_MODULE(FailingTanh);

}  // namespace

TEST_CASE("an error inside a stage names the stage, and whether it was a recomputation",
          "[runtime]") {
  // A user's trial: an error of a stage's own code at train time, in a recomputation inside
  // loss.backward(), said nothing of where it came from.
  FailingTanh failing;
  nn::Sequential net(nn::Linear(6, 6), nn::Tanh(), nn::Linear(6, 6), failing, nn::Linear(6, 6));
  remat::Checkpointable chk(net);
  const torch::Tensor x = torch::randn({3, 6});
  chk->measure(x, remat::ProfileOptions().measure_time(false));
  chk->compute_sequence(chk->store_all_peak(), Algorithm::kRecomputeAll);
  const auto message_of = [&](int fail_at) {
    failing->calls = 0;
    failing->fail_at = fail_at;
    try {
      chk->forward(x).sum().backward();
    } catch (const c10::Error& error) {
      return std::string(error.what_without_backtrace());
    }
    return std::string("no exception");
  };
  CHECK_THAT(message_of(0),
             Catch::StartsWith("the stage's own error") &&
                 Catch::Contains("in stage 3 (3:FailingTanh) of remat's chain, in the forward"));
  CHECK_THAT(
      message_of(1),
      Catch::StartsWith("the stage's own error") &&
          Catch::Contains(
              "in stage 3 (3:FailingTanh) of remat's chain, recomputed during the backward"));
  failing->fail_at = -1;
  CHECK_NOTHROW(chk->forward(x).sum().backward());  // the module is usable again
}

namespace {

// Tanh whose output, once told, differs after the step's first call: a row fewer, or Double.
struct FickleTanhImpl : nn::Module {
  enum class Change { kNone, kRows, kDtype } change = Change::kNone;
  int calls = 0;
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor y = torch::tanh(x);
    if (calls++ == 0 || change == Change::kNone) return y;
    return change == Change::kRows ? y.narrow(0, 0, y.size(0) - 1) : y.to(torch::kDouble);
  }
};
TORCH_MODULE(FickleTanh);

}  // namespace

TEST_CASE("a recomputation that returns another shape or dtype is refused, naming the stage",
          "[runtime]") {
  // Autograd said only "Function remat::GradientSource returned an invalid gradient at index
  // 0 - got [2, 6] but expected shape compatible with [3, 6]", naming no stage.
  FickleTanh fickle;
  nn::Sequential net(nn::Linear(6, 6), fickle, nn::Linear(6, 6), nn::Linear(6, 6));
  remat::Checkpointable chk(net);
  const torch::Tensor x = torch::randn({3, 6});
  chk->measure(x, remat::ProfileOptions().measure_time(false));
  chk->compute_sequence(chk->store_all_peak(), Algorithm::kRecomputeAll);
  const auto message_of = [&](FickleTanhImpl::Change change) {
    fickle->calls = 0;
    fickle->change = change;
    try {
      chk->forward(x).sum().backward();
    } catch (const c10::ValueError& error) {
      return std::string(error.what_without_backtrace());
    }
    return std::string("no exception");
  };
  CHECK_THAT(message_of(FickleTanhImpl::Change::kRows),
             Catch::StartsWith("remat runtime: stage 1 (1:FickleTanh) returned output member 0 "
                               "as Float [2, 6] on cpu when recomputed during the backward, but "
                               "as Float [3, 6] on cpu in the step's forward") &&
                 Catch::Contains("needs the same output each time"));
  CHECK_THAT(message_of(FickleTanhImpl::Change::kDtype),
             Catch::StartsWith("remat runtime: stage 1 (1:FickleTanh) returned output member 0 "
                               "as Double [3, 6] on cpu when recomputed"));
  CHECK(message_of(FickleTanhImpl::Change::kNone) == "no exception");  // usable again
}

TEST_CASE("an input larger than the measured sample is refused, a smaller one runs", "[runtime]") {
  torch::manual_seed(4);
  nn::Sequential net = remat::test::conv_chain(4, 5, false);
  remat::Checkpointable chk(net);
  chk->measure(torch::randn({4, 3, 12, 12}), remat::ProfileOptions().measure_time(false));
  chk->compute_sequence(remat::min_feasible_budget(chk->chain(), remat::SolveOptions(0)) +
                        remat::runtime_reserve_bytes(torch::kCPU));
  CHECK_THROWS_WITH(chk->forward(torch::randn({5, 3, 12, 12})),
                    Catch::Contains("the input is 5x3x12x12 but the schedule was computed for "
                                    "4x3x12x12") && Catch::Contains("call measure()"));
  CHECK_THROWS_WITH(chk->forward(torch::randn({2, 3, 16, 8})), Catch::Contains("2x3x16x8"));
  // The last, smaller batch of an epoch: same schedule, same gradients as plain.
  const torch::Tensor small = torch::randn({3, 3, 12, 12});
  chk->forward(small).sum().backward();
  std::vector<torch::Tensor> ours;
  for (const auto& p : net->parameters()) ours.push_back(p.grad().clone()), p.mutable_grad().zero_();
  net->forward(small).sum().backward();
  std::size_t k = 0;
  for (const auto& p : net->parameters()) CHECK(torch::allclose(ours[k++], p.grad()));
  // A chain from a file knows only the input's bytes.
  remat::Chain chain = chk->chain();
  chk->set_chain(chain);
  chk->compute_sequence(remat::store_all_peak(chain) + remat::runtime_reserve_bytes(torch::kCPU));
  CHECK_NOTHROW(chk->forward(torch::randn({2, 3, 12, 24})));  // same bytes
  CHECK_THROWS_WITH(chk->forward(torch::randn({4, 3, 12, 13})),
                    Catch::Contains("larger than the chain's (6912 bytes)"));
  // The module stays usable: the right input runs after the refusals.
  CHECK_NOTHROW(chk->forward(torch::randn({4, 3, 12, 12})).sum().backward());
}

TEST_CASE("measured peak stays within the budget and close to the prediction", "[runtime]") {
  torch::set_num_threads(1);
  struct Net {
    const char* name;
    int channels, batch, size;
    bool dropout;
  };
  // Granularity 1: the CPU's exact bytes; 512: CUDA's caching-allocator blocks, in which the
  // profiler measures, the reserve is counted and the runtime's scalars cost 512 bytes each.
  const std::int64_t granularity = GENERATE(1, 512);
  remat::test::CpuGranularity units(granularity);
  int after_loss = 0;
  for (const Net& n : {Net{"conv chain", 8, 4, 24, false}, Net{"with dropout", 8, 3, 20, true}}) {
    torch::manual_seed(21);
    nn::Sequential net = remat::test::conv_chain(n.channels, 10, n.dropout);
    const torch::Tensor sample = torch::randn({n.batch, 3, n.size, n.size});
    remat::Checkpointable chk(net);
    chk->measure(sample.clone().requires_grad_(true), remat::ProfileOptions().measure_time(false));
    for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
    torch::Tensor weight;
    {
      torch::NoGradGuard no_grad;
      weight = torch::ones_like(net->forward(sample));
    }
    const std::int64_t kR = remat::runtime_reserve_bytes(torch::kCPU);
    CHECK(kR == remat::kRuntimeReserveTensors * remat::counted_bytes(torch::kCPU, 32));
    const std::int64_t full = remat::store_all_peak(chk->chain()) + kR;
    const std::int64_t least = remat::min_feasible_budget(chk->chain(), remat::SolveOptions(0)) + kR;
    for (const auto& [algorithm, budget] :
         std::vector<std::pair<Algorithm, std::int64_t>>{{Algorithm::kOptimal, least},
                                                         {Algorithm::kOptimal, (least + full) / 2},
                                                         {Algorithm::kOptimal, full},
                                                         {Algorithm::kPeriodic, full},
                                                         {Algorithm::kRevolve, (2 * least + full) / 3},
                                                         {Algorithm::kRecomputeAll, full}}) {
      const remat::Solution& s = chk->compute_sequence(budget, algorithm);
      remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(torch::kCPU);
      const std::int64_t base = tracker.live();
      tracker.reset_peak();
      {
        // The output kept to the step's end, as the chain says (output_held, the default).
        torch::Tensor x = sample.clone().requires_grad_(true);
        torch::Tensor out = chk->forward(x);
        torch::Tensor loss = (out * weight).sum();
        loss.backward();
      }
      const std::int64_t measured = tracker.peak() - base;
      INFO(n.name << ", granularity " << granularity << ": " << remat::algorithm_name(algorithm)
                  << " budget " << budget << " predicted " << s.peak_bytes << " measured "
                  << measured << "\n"
                  << remat::collapsed_string(s.sequence));
      CHECK(measured <= budget);  // the loss value and the runtime's scalars included
      CHECK(s.budget_bytes == budget);
      // Exact: the prediction includes the reserve, the chain's own is kR less, and the step
      // holds two scalars beyond the chain's prediction, the loss and the seed of its backward
      // (8 bytes on the CPU, two 512-byte blocks at CUDA's granularity).
      const std::int64_t scalars = 2 * remat::counted_bytes(torch::kCPU, 4);
      // One exception, store-all with dropout: the model's peak is the classifier's backward
      // B_{L-1}, which it charges with y_L until the stage's backward ends; autograd frees y_L
      // once the linear layer's backward has used it, before the pooling's makes y_{L-1}: y_L
      // (as many bytes as x_L) less.
      const bool frees_y_l = n.dropout && s.peak_bytes == full;
      const std::int64_t y_l = chk->chain().stages.back().out_bytes();  // measured in units
      CHECK(measured == s.peak_bytes - kR + scalars - (frees_y_l ? y_l : 0));
      // Schedules whose peak a model without the caller's output would under-predict.
      remat::Chain released = chk->chain();
      released.output_held = false;
      if (remat::simulate(released, s.sequence).peak_bytes < s.peak_bytes - kR) ++after_loss;
    }
  }
  CHECK(after_loss > 0);
}

TEST_CASE("out of memory abandons the step cleanly, and a smaller budget then trains exactly",
          "[runtime]") {
  torch::set_num_threads(1);
  const torch::Tensor sample = torch::randn({4, 3, 24, 24});
  auto make = [] { return remat::test::conv_chain(8, 10, true); };
  // The reference: plain autograd on the same weights (gradients do not depend on BatchNorm's
  // running statistics, which the failed steps have updated).
  nn::Sequential net = fresh(make);
  remat::Checkpointable chk(net);
  chk->measure(sample, remat::ProfileOptions().measure_time(false));
  for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
  const remat::Chain& chain = chk->chain();
  const std::int64_t kR = remat::runtime_reserve_bytes(torch::kCPU);
  const std::int64_t full = remat::store_all_peak(chain) + kR;
  const std::int64_t least = remat::min_feasible_budget(chain, remat::SolveOptions(0)) + kR;
  // Room between the least budget and store-all (the Conv+BN+ReLU stages' forward transients
  // set the least: model v2 counts what plain autograd keeps, not much more).
  REQUIRE(least < full);
  remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(torch::kCPU);
  const torch::Tensor x = sample.clone();
  auto step = [&]() {  // returns "" or the phase that ran out of memory
    torch::manual_seed(9);
    torch::Tensor out;
    try {
      out = chk->forward(x);
    } catch (const c10::OutOfMemoryError&) {
      return std::string("forward");
    }
    try {
      ((out * out).sum() + out.mean()).backward();
    } catch (const c10::OutOfMemoryError&) {
      return std::string("backward");
    }
    return std::string();
  };
  auto grads = [&] {
    std::vector<torch::Tensor> g;
    for (const auto& p : net->parameters()) g.push_back(p.grad().clone()), p.mutable_grad().zero_();
    return g;
  };
  torch::manual_seed(9);
  {
    torch::Tensor out = net->forward(x);
    ((out * out).sum() + out.mean()).backward();
  }
  const std::vector<torch::Tensor> plain = grads();

  // Store-all under limits from just above the forward phase's needs to just below its peak:
  // both phases run out of memory somewhere in that range.
  chk->compute_sequence(full, Algorithm::kStoreAll);
  std::map<std::string, int> failures;
  for (int k = 1; k <= 12; ++k) {
    const std::int64_t base = tracker.live();
    const std::int64_t limit = base + chain.input_bytes() + (full - chain.input_bytes()) * k / 13;
    std::string phase;
    {
      remat::test::CpuLimit cap(limit);
      phase = step();
    }
    INFO("limit " << limit - base << " of " << full << " bytes: " << (phase.empty() ? "ran" : phase));
    CHECK(tracker.live() == base);  // everything the step held is freed
    if (!phase.empty()) ++failures[phase];
    grads();
    // A schedule for what the limit leaves runs, with plain autograd's gradients.
    const std::int64_t budget = std::max(least, limit - base);
    chk->compute_sequence(budget);
    {
      remat::test::CpuLimit cap(base + budget);
      REQUIRE(step().empty());
    }
    CHECK(remat::test::same_tensors(grads(), plain));
    chk->compute_sequence(full, Algorithm::kStoreAll);
  }
  CHECK(failures["forward"] >= 1);
  CHECK(failures["backward"] >= 1);
}

// ---- On a GPU (skipped without one). Deterministic algorithms, so that a difference between
// checkpointed and plain training cannot hide behind nondeterministic cuDNN or cuBLAS kernels.
namespace {

// Deterministic algorithms while alive; the settings before it afterwards, so that the tests
// after it in the same process (Catch runs them in one) are not held to them: adaptive average
// pooling to 2x2 has no deterministic CUDA backward.
class DeterministicCuda {
 public:
  DeterministicCuda()
      : algorithms_(at::globalContext().deterministicAlgorithms()),
        warn_only_(at::globalContext().deterministicAlgorithmsWarnOnly()),
        cudnn_(at::globalContext().deterministicCuDNN()),
        benchmark_(at::globalContext().benchmarkCuDNN()) {
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/1);  // before cuBLAS starts
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setBenchmarkCuDNN(false);
  }
  ~DeterministicCuda() {
    at::globalContext().setDeterministicAlgorithms(algorithms_, warn_only_);
    at::globalContext().setDeterministicCuDNN(cudnn_);
    at::globalContext().setBenchmarkCuDNN(benchmark_);
  }
  DeterministicCuda(const DeterministicCuda&) = delete;
  DeterministicCuda& operator=(const DeterministicCuda&) = delete;

 private:
  bool algorithms_, warn_only_, cudnn_, benchmark_;
};

struct OnCuda {
  nn::Sequential net;
  remat::Checkpointable chk;
  torch::Tensor sample;
};

// `net` on the first GPU, measured on a batch of `batch` 64x64 images, its parameter gradients
// allocated.
OnCuda measured_on_cuda(nn::Sequential net, int batch) {
  const torch::Device cuda(torch::kCUDA, 0);
  net->to(cuda);
  const torch::Tensor sample = torch::randn({batch, 3, 64, 64}).to(cuda);
  remat::Checkpointable chk(net);
  chk->measure(sample.clone().requires_grad_(true), remat::ProfileOptions().measure_time(false));
  for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
  return {net, chk, sample};
}

}  // namespace

TEST_CASE("on CUDA, checkpointed training equals plain training: gradients, BatchNorm, dropout",
          "[runtime][cuda]") {
  REMAT_REQUIRE_CUDA();
  DeterministicCuda deterministic;
  const torch::Device cuda(torch::kCUDA, 0);
  const torch::Tensor sample = torch::randn({8, 3, 32, 32}).to(cuda);
  auto make = [&] {
    nn::Sequential net = remat::test::conv_chain(16, 10, true, 1);  // BatchNorm and Dropout
    net->to(cuda);
    return net;
  };
  nn::Sequential reference_net = fresh(make);
  const StepResult plain = train(*reference_net, [&](const torch::Tensor& x) { return reference_net->forward(x); },
                                 sample, 2, 5);
  nn::Sequential probe = fresh(make);
  // The steps train the input's gradient too (train() makes it require one), as measured.
  const remat::Chain chain = remat::profile(probe, sample.clone().requires_grad_(true),
                                            remat::ProfileOptions().measure_time(false))
                                 .chain;
  CHECK(chain.input_bytes() % 512 == 0);
  for (const remat::Stage& stage : chain.stages) CHECK(stage.out_bytes() % 512 == 0);
  const std::int64_t kR = remat::runtime_reserve_bytes(cuda);
  CHECK(kR == 4096);
  const std::int64_t full = remat::store_all_peak(chain) + kR;
  const std::int64_t least = remat::min_feasible_budget(chain, remat::SolveOptions(0)) + kR;
  for (const auto& [algorithm, budget] : std::vector<std::pair<Algorithm, std::int64_t>>{
           {Algorithm::kOptimal, least}, {Algorithm::kOptimal, (least + full) / 2},
           {Algorithm::kStoreAll, full}, {Algorithm::kRecomputeAll, full},
           {Algorithm::kRevolve, (least + full) / 2}}) {
    DYNAMIC_SECTION(remat::algorithm_name(algorithm) << " at " << budget << " bytes") {
      nn::Sequential net = fresh(make);
      remat::Checkpointable chk(net);
      chk->set_chain(chain);
      const remat::Solution& s = chk->compute_sequence(budget, algorithm);
      INFO(remat::collapsed_string(s.sequence));
      const StepResult ours = train(*net, [&](const torch::Tensor& x) { return chk->forward(x); }, sample, 2, 5);
      check_equal(plain, ours);  // outputs, input and parameter gradients, BatchNorm buffers
    }
  }
}

TEST_CASE("on CUDA under autocast, recomputations run as the forward did: float16",
          "[runtime][cuda]") {
  REMAT_REQUIRE_CUDA();
  DeterministicCuda deterministic;
  check_autocast_training(torch::Device(torch::kCUDA, 0), c10::kHalf);
}

TEST_CASE("on CUDA, a recomputation reads the buffers the stage's first forward read",
          "[runtime][cuda]") {
  // On a GPU the buffers are kept in pinned memory, copied without waiting for the GPU.
  REMAT_REQUIRE_CUDA();
  DeterministicCuda deterministic;
  check_buffers_read_after_update(torch::Device(torch::kCUDA, 0));
}

TEST_CASE("on CUDA, the measured peak stays within the budget and close to the prediction",
          "[runtime][cuda]") {
  REMAT_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  torch::manual_seed(21);
  auto [net, chk, sample] = measured_on_cuda(remat::test::conv_chain(32, 10, false), 32);
  torch::Tensor weight;
  {
    torch::NoGradGuard no_grad;
    weight = torch::ones_like(net->forward(sample));
  }
  const std::int64_t kR = remat::runtime_reserve_bytes(cuda);
  const std::int64_t full = remat::store_all_peak(chk->chain()) + kR;
  const std::int64_t least = remat::min_feasible_budget(chk->chain(), remat::SolveOptions(0)) + kR;
  remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(cuda);
  for (const auto& [algorithm, budget] : std::vector<std::pair<Algorithm, std::int64_t>>{
           {Algorithm::kOptimal, least}, {Algorithm::kOptimal, (least + full) / 2},
           {Algorithm::kOptimal, full}, {Algorithm::kPeriodic, full}}) {
    const remat::Solution& s = chk->compute_sequence(budget, algorithm);
    remat::synchronize(cuda);
    const std::int64_t base = tracker.live();
    tracker.reset_peak();
    {
      torch::Tensor x = sample.clone().requires_grad_(true);
      const torch::Tensor out = chk->forward(x);  // kept to the step's end (output_held)
      torch::Tensor loss = (out * weight).sum();
      loss.backward();
    }
    remat::synchronize(cuda);
    const std::int64_t measured = tracker.peak() - base;
    INFO(remat::algorithm_name(algorithm) << " budget " << budget << " predicted " << s.peak_bytes
                                          << " measured " << measured);
    CHECK(measured <= budget);
    CHECK(measured <= s.peak_bytes - kR + 3 * 512);
    CHECK(measured >= 0.95 * static_cast<double>(s.peak_bytes - kR));
  }
}

TEST_CASE("on CUDA, out of memory abandons the step and a smaller budget then runs",
          "[runtime][cuda]") {
  REMAT_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  torch::manual_seed(22);
  // 32 Conv+BatchNorm+ReLU stages of 32 MiB tensors: the least budget is a few stages' worth
  // (on an H200, conv_chain's 5 stages of 64 MiB needed 75% of store-all: cuDNN's backward
  // workspaces), far below store-all.
  nn::Sequential deep;
  deep->push_back(remat::Block(nn::Conv2d(nn::Conv2dOptions(3, 32, 3).padding(1).bias(false)),
                               nn::BatchNorm2d(32), nn::ReLU()));
  for (int k = 0; k < 31; ++k)
    deep->push_back(remat::Block(nn::Conv2d(nn::Conv2dOptions(32, 32, 3).padding(1).bias(false)),
                                 nn::BatchNorm2d(32), nn::ReLU()));
  auto [net, chk, sample] = measured_on_cuda(deep, 64);
  const std::int64_t kR = remat::runtime_reserve_bytes(cuda);
  const std::int64_t full = remat::store_all_peak(chk->chain()) + kR;
  const std::int64_t least = remat::min_feasible_budget(chk->chain(), remat::SolveOptions(0)) + kR;
  REQUIRE(least < full / 2);
  remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(cuda);
  remat::synchronize(cuda);
  const std::int64_t base = tracker.live();
  // The limit bounds the caching allocator's reserved memory, which it frees from its cache
  // before giving up: what is live now, the least budget and room for rounding up to its
  // 20 MiB segments, far below store-all.
  remat::limit_device_memory(cuda, base + least + (full - least) / 4 + (std::int64_t{64} << 20));
  chk->compute_sequence(full, Algorithm::kStoreAll);
  CHECK_THROWS_AS(chk->forward(sample).sum().backward(), c10::OutOfMemoryError);
  remat::synchronize(cuda);
  CHECK(tracker.live() == base);
  chk->compute_sequence(least);
  CHECK_NOTHROW(chk->forward(sample).sum().backward());
  remat::limit_device_memory(cuda, 0);
}

TEST_CASE("with the loss measured, a cross-entropy step stays within every budget",
          "[runtime]") {
  // The logits' softmax and its gradient live while the loss runs: without the loss in the
  // chain (loss_tmp_bytes), a step at the store-all budget exceeds it by about twice the
  // logits' bytes.
  torch::set_num_threads(1);
  const std::int64_t granularity = GENERATE(1, 512);
  remat::test::CpuGranularity units(granularity);
  torch::manual_seed(31);
  nn::Sequential net = remat::test::conv_chain(8, 500, false);
  const torch::Tensor sample = torch::randn({16, 3, 16, 16});
  const torch::Tensor target = torch::randint(500, {16}, torch::kLong);
  auto loss = [&](const torch::Tensor& out) { return torch::nn::functional::cross_entropy(out, target); };
  remat::Checkpointable chk(net);
  const remat::Chain& chain = chk->measure(sample, remat::ProfileOptions().measure_time(false).loss(loss));
  const std::int64_t logits = remat::counted_bytes(torch::kCPU, 16 * 500 * 4);
  INFO("granularity " << granularity << ", loss_tmp_bytes " << chain.loss_tmp_bytes);
  CHECK(chain.loss_tmp_bytes >= logits);
  CHECK(chain.loss_tmp_bytes <= 3 * logits);
  for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
  const std::int64_t kR = remat::runtime_reserve_bytes(torch::kCPU);
  const std::int64_t full = remat::store_all_peak(chain) + kR;
  const std::int64_t least = remat::min_feasible_budget(chain, remat::SolveOptions(0)) + kR;
  remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(torch::kCPU);
  for (const std::int64_t budget : {full, (least + full) / 2, least}) {
    const remat::Solution& s = chk->compute_sequence(budget);
    const std::int64_t base = tracker.live();
    tracker.reset_peak();
    {
      torch::Tensor x = sample.clone();
      torch::Tensor value = loss(chk->forward(x));
      value.backward();
    }
    const std::int64_t measured = tracker.peak() - base;
    INFO("budget " << budget << " predicted " << s.peak_bytes << " measured " << measured);
    CHECK(measured <= budget);
    CHECK(measured <= s.peak_bytes - kR + 3 * remat::counted_bytes(torch::kCPU, 4));
  }
  // A loss that does not return one value is refused, naming it.
  CHECK_THROWS_WITH(remat::profile(net, sample, remat::ProfileOptions().measure_time(false).loss(
                                                   [](const torch::Tensor& out) { return out * 2; })),
                    Catch::Contains("the loss function returned a tensor of shape"));
}

TEST_CASE("a loss measured with the output let go gives the budget the logits back, exactly",
          "[runtime]") {
  // A language model's head: the logits are the largest tensor of the step, and the peak is
  // at the loss. A cross-entropy keeps their log-softmax, not the logits, so a step that lets
  // the output go once the loss has its value peaks one logits lower than one that keeps it
  // (the default). Each measured as it is written, the prediction is its peak, exactly.
  torch::set_num_threads(1);
  const std::int64_t granularity = GENERATE(1, 512);
  remat::test::CpuGranularity units(granularity);
  const std::int64_t batch = 64, classes = 3000;
  const torch::Tensor sample = torch::randn({batch, 32});
  const torch::Tensor target = torch::randint(classes, {batch}, torch::kLong);
  auto loss = [&](const torch::Tensor& out) {
    return torch::nn::functional::cross_entropy(out, target);
  };
  const std::int64_t logits = remat::counted_bytes(torch::kCPU, batch * classes * 4);
  const std::int64_t kR = remat::runtime_reserve_bytes(torch::kCPU);
  remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(torch::kCPU);
  std::map<bool, std::int64_t> store_all;
  for (const bool held : {true, false}) {
    torch::manual_seed(41);
    nn::Sequential net(nn::Linear(32, 128), nn::Tanh(), nn::Linear(128, 64), nn::ReLU(),
                       nn::Linear(64, classes));
    for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
    remat::Checkpointable chk(net);
    const remat::Chain& chain = chk->measure(
        sample, remat::ProfileOptions().measure_time(false).loss(loss).output_held(held));
    CHECK(chain.output_held == held);
    CHECK(remat::parse_chain(remat::chain_to_json(chain), "saved").output_held == held);
    store_all[held] = chk->store_all_peak();
    const std::int64_t least = chk->min_budget();
    for (const std::int64_t budget : {store_all[held], (least + store_all[held]) / 2, least}) {
      const remat::Solution& s = chk->compute_sequence(budget);
      REQUIRE(s.ok());
      const std::int64_t base = tracker.live();
      tracker.reset_peak();
      // Each step written as its chain says: the output kept to the end, or let go with the
      // statement that computes the loss.
      {
        torch::Tensor x = sample.clone();
        if (held) {
          torch::Tensor out = chk->forward(x);
          torch::Tensor value = loss(out);
          value.backward();
        } else {
          torch::Tensor value = loss(chk->forward(x));
          value.backward();
        }
      }
      const std::int64_t measured = tracker.peak() - base;
      INFO("output held " << held << ", budget " << budget << ", predicted " << s.peak_bytes
                          << ", measured " << measured << ", granularity " << granularity);
      CHECK(measured <= budget);
      // The loss's two scalars are in its measurement (loss_tmp_bytes).
      CHECK(measured == s.peak_bytes - kR);
    }
  }
  CHECK(store_all[true] - store_all[false] == logits);
}

TEST_CASE("bytes outside the chain come out of every budget with the reserve, and every figure "
          "includes them",
          "[runtime]") {
  torch::manual_seed(3);
  nn::Sequential net(nn::Linear(16, 64), nn::ReLU(), nn::Linear(64, 64), nn::ReLU(),
                     nn::Linear(64, 4));
  const remat::Chain chain = remat::profile(net, torch::randn({8, 16}).requires_grad_(true),
                                            remat::ProfileOptions().measure_time(false))
                                 .chain;
  const std::int64_t extra = 3 << 20;
  const std::int64_t reserve = remat::runtime_reserve_bytes(torch::kCPU);
  remat::Checkpointable plain(net), outside(net);
  plain->set_chain(chain);
  outside->set_chain(chain);
  outside->set_outside_bytes(extra);
  CHECK(outside->outside_bytes() == extra);
  CHECK(plain->reserve_bytes() == reserve);
  CHECK(outside->reserve_bytes() == reserve + extra);
  CHECK(outside->store_all_peak() == remat::store_all_peak(chain) + reserve + extra);
  const std::int64_t least = outside->min_budget();
  CHECK(least == plain->min_budget() + extra);
  for (const std::int64_t budget : {least, outside->store_all_peak()}) {
    const remat::Solution ours = outside->compute_sequence(budget);
    const remat::Solution theirs = plain->compute_sequence(budget - extra);
    REQUIRE(ours.ok());
    CHECK(ours.budget_bytes == budget);
    CHECK(ours.peak_bytes == theirs.peak_bytes + extra);
    CHECK(ours.peak_bytes == ours.simulation.peak_bytes + reserve + extra);
    CHECK(ours.min_feasible_budget_bytes == least);
  }
  CHECK_FALSE(outside->compute_sequence(least - 1).ok());
  CHECK_THROWS_AS(outside->set_outside_bytes(-1), c10::ValueError);
}
