// The runtime's offloads (docs/runtime.md, "Offload"): schedules that copy checkpoints to host
// memory and back train exactly as plain autograd does, hold on the device exactly what the
// simulator predicts, hold on the host what it predicts, and keep no host memory, device memory
// or state of a step that failed.
#include <ATen/Context.h>
#include <catch2/catch.hpp>

#include <cstdlib>

#include <functional>
#include <string>
#include <vector>

#include "profiler/test_nets.h"
#include "remat/runtime.h"
#include "remat/solver.h"
#include "skip.h"

namespace nn = torch::nn;

namespace {

// Ten stages of Linear + BatchNorm + ReLU, one with dropout (random numbers to replay), then a
// classifier: checkpoints worth offloading, statistics to update once.
nn::Sequential mlp(int width) {
  nn::Sequential net;
  for (int k = 0; k < 10; ++k) {
    if (k == 4)
      net->push_back(remat::Block(nn::Linear(width, width), nn::BatchNorm1d(width), nn::ReLU(),
                                  nn::Dropout(0.25)));
    else
      net->push_back(remat::Block(nn::Linear(width, width), nn::BatchNorm1d(width), nn::ReLU()));
  }
  net->push_back(nn::Linear(width, 10));
  return net;
}

nn::Sequential fresh(int width) {
  torch::manual_seed(31);
  return mlp(width);
}

// The chain of `net` on `sample` (memory measured), with times that make recomputing cost
// something (a forward 1 ms, its backward 2) and a link that makes copying cost nearly
// nothing: where the budget allows, the optimum offloads rather than recomputes.
// With `loss`, the loss's own memory is measured into the chain (loss_tmp_bytes).
remat::Chain offloading_chain(nn::Sequential& net, const torch::Tensor& sample,
                              remat::LossFunction loss = nullptr) {
  remat::Chain chain =
      remat::profile(net, sample.clone().requires_grad_(true),
                     remat::ProfileOptions().measure_time(false).loss(std::move(loss)))
          .chain;
  for (remat::Stage& stage : chain.stages) {
    stage.fwd_ms = 1.0;
    stage.fwd_nograd_ms = 0.8;
    stage.bwd_ms = 2.0;
  }
  chain.link = remat::Link{1000.0, 1000.0, 0.0001};
  return chain;
}

torch::Tensor square_sum(const torch::Tensor& out) { return (out * out).sum(); }

struct Trained {
  std::vector<torch::Tensor> outputs, state;  // each step's output; gradients, then buffers
  torch::Tensor input_grad;
};

// Two training steps, gradients accumulating.
template <class Forward>
Trained train(nn::Module& net, Forward forward, const torch::Tensor& sample) {
  torch::manual_seed(5);
  Trained r;
  torch::Tensor x = sample.clone().requires_grad_(true);
  for (int s = 0; s < 2; ++s) {
    torch::Tensor out = forward(x);
    ((out * out).sum() + out.mean()).backward();
    r.outputs.push_back(out.detach().clone());
  }
  r.input_grad = x.grad().clone();
  for (const auto& p : net.parameters()) r.state.push_back(p.grad().clone());
  for (const auto& b : net.buffers()) r.state.push_back(b.clone());
  return r;
}

void check_equal(const Trained& a, const Trained& b) {
  REQUIRE(a.outputs.size() == b.outputs.size());
  for (std::size_t k = 0; k < a.outputs.size(); ++k) CHECK(torch::equal(a.outputs[k], b.outputs[k]));
  CHECK(torch::equal(a.input_grad, b.input_grad));
  REQUIRE(a.state.size() == b.state.size());
  for (std::size_t k = 0; k < a.state.size(); ++k) {
    INFO("gradient or buffer " << k);
    CHECK(torch::equal(a.state[k], b.state[k]));
  }
}

int count(const remat::Sequence& sequence, remat::OpKind kind) {
  int n = 0;
  for (const remat::Op& op : sequence) n += op.kind == kind;
  return n;
}

// A fresh network from `make`, trained two steps under the offloading schedule of `chain` for
// `budget`, checked equal to `plain` bit for bit. Returns it, with its schedule.
remat::Checkpointable train_offloading(const std::function<nn::Sequential()>& make,
                                       const remat::Chain& chain, std::int64_t budget,
                                       const torch::Tensor& sample, const Trained& plain) {
  nn::Sequential net = make();
  remat::Checkpointable chk(net);
  chk->set_chain(chain);
  const remat::Solution& s = chk->compute_sequence(remat::SolveOptions(budget).offload(true));
  REQUIRE(s.ok());
  INFO("budget " << budget << ": " << remat::collapsed_string(s.sequence));
  check_equal(plain, train(*net, [&](const torch::Tensor& x) { return chk->forward(x); }, sample));
  return chk;
}

// Budgets from the least to store-all's peak, reserve included.
std::vector<std::int64_t> budgets(const remat::Chain& chain, c10::Device device) {
  const std::int64_t kR = remat::runtime_reserve_bytes(device);
  const std::int64_t full = remat::store_all_peak(chain) + kR;
  const std::int64_t least =
      remat::min_feasible_budget(chain, remat::SolveOptions(0).offload(true)) + kR;
  std::vector<std::int64_t> out;
  for (int k = 0; k <= 4; ++k) out.push_back(least + (full - least) * k / 5);
  return out;
}

}  // namespace

TEST_CASE("offloading training equals plain training, bit for bit", "[runtime][offload]") {
  torch::set_num_threads(1);
  const torch::Tensor sample = torch::randn({16, 64});
  nn::Sequential reference = fresh(64);
  const Trained plain =
      train(*reference, [&](const torch::Tensor& x) { return reference->forward(x); }, sample);
  nn::Sequential probe = fresh(64);
  const remat::Chain chain = offloading_chain(probe, sample);
  int offloading = 0;
  for (const std::int64_t budget : budgets(chain, torch::kCPU)) {
    const remat::Checkpointable chk =
        train_offloading([] { return fresh(64); }, chain, budget, sample, plain);
    const remat::Solution& s = chk->solution();
    INFO("budget " << budget << ": " << remat::collapsed_string(s.sequence));
    offloading += s.simulation.offloads > 0;
    CHECK(count(s.sequence, remat::OpKind::kOffload) == s.simulation.offloads);
    CHECK(count(s.sequence, remat::OpKind::kPrefetch) == s.simulation.offloads);
    CHECK(chk->host_memory().in_use_bytes == 0);  // every copy given back
  }
  CHECK(offloading >= 2);  // the test means something only where schedules offload
}

TEST_CASE("with offloads, the measured device and host peaks are the predicted ones",
          "[runtime][offload]") {
  torch::set_num_threads(1);
  const std::int64_t granularity = GENERATE(1, 512);
  remat::test::CpuGranularity units(granularity);
  const torch::Tensor sample = torch::randn({16, 64});
  nn::Sequential net = fresh(64);
  const remat::Chain chain = offloading_chain(net, sample);
  remat::Checkpointable chk(net);
  chk->set_chain(chain);
  for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
  const std::int64_t kR = remat::runtime_reserve_bytes(torch::kCPU);
  const std::int64_t scalars = 2 * remat::counted_bytes(torch::kCPU, 4);  // the loss, its seed
  int offloading = 0;
  for (const std::int64_t budget : budgets(chk->chain(), torch::kCPU)) {
    const remat::Solution& s = chk->compute_sequence(remat::SolveOptions(budget).offload(true));
    REQUIRE(s.ok());
    remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(torch::kCPU);
    std::int64_t blocks = 0;
    for (int step = 0; step < 2; ++step) {
      const std::int64_t base = tracker.live();
      tracker.reset_peak();
      chk->reset_host_peak();
      {
        torch::Tensor x = sample.clone().requires_grad_(true);
        torch::Tensor out = chk->forward(x);
        // The loss in a statement of its own: the product (a temporary of out's size) is gone
        // before the backward, as the chain (measured without a loss) assumes.
        torch::Tensor loss = (out * out).sum();
        loss.backward();
      }
      const std::int64_t measured = tracker.peak() - base;
      INFO("granularity " << granularity << ", budget " << budget << ", step " << step
                          << ": predicted " << s.peak_bytes << ", measured " << measured << "\n"
                          << remat::collapsed_string(s.sequence));
      CHECK(measured <= budget);
      CHECK(measured == s.peak_bytes - kR + scalars);
      CHECK(tracker.live() == base);
      const remat::CheckpointableImpl::HostMemory host = chk->host_memory();
      CHECK(host.in_use_bytes == 0);
      // The host holds each copy's storage bytes; the chain counts them in the tracker's units.
      if (granularity == 1) CHECK(host.peak_bytes == s.simulation.host_peak_bytes);
      CHECK(host.peak_bytes <= s.simulation.host_peak_bytes);
      if (step == 0) blocks = host.blocks;
      if (step == 1) CHECK(host.blocks == blocks);  // the second step allocates no host block
    }
    offloading += s.simulation.offloads > 0;
  }
  CHECK(offloading > 0);
}

TEST_CASE("a step with offloads that fails frees everything, and the module trains on",
          "[runtime][offload]") {
  torch::set_num_threads(1);
  const torch::Tensor sample = torch::randn({16, 64});
  nn::Sequential reference = fresh(64);
  for (auto& p : reference->parameters()) p.mutable_grad() = torch::zeros_like(p);
  torch::manual_seed(9);
  {
    torch::Tensor out = reference->forward(sample);
    (out * out).sum().backward();
  }
  std::vector<torch::Tensor> plain;
  for (const auto& p : reference->parameters()) plain.push_back(p.grad().clone());

  nn::Sequential net = fresh(64);
  remat::Checkpointable chk(net);
  chk->set_chain(offloading_chain(net, sample, square_sum));
  for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
  // The schedule with the most offloads among the budgets.
  std::int64_t chosen = -1;
  std::int64_t most = 0;
  for (const std::int64_t budget : budgets(chk->chain(), torch::kCPU)) {
    const remat::Solution& s = chk->compute_sequence(remat::SolveOptions(budget).offload(true));
    if (s.simulation.offloads > most) most = s.simulation.offloads, chosen = budget;
  }
  REQUIRE(chosen > 0);
  const remat::Solution& s = chk->compute_sequence(remat::SolveOptions(chosen).offload(true));
  INFO(remat::collapsed_string(s.sequence));
  remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(torch::kCPU);
  auto step = [&]() {  // "" or the phase that ran out of memory
    torch::manual_seed(9);
    torch::Tensor out;
    try {
      out = chk->forward(sample);
    } catch (const c10::OutOfMemoryError&) {
      return std::string("forward");
    }
    try {
      (out * out).sum().backward();
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
  // Limits from the input alone to just below the schedule's peak: steps fail in both phases,
  // some of them with copies on the host.
  int failed = 0;
  for (int k = 0; k < 10; ++k) {
    const std::int64_t base = tracker.live();
    const std::int64_t limit = base + (s.peak_bytes - remat::runtime_reserve_bytes(torch::kCPU)) * k / 10;
    std::string phase;
    {
      remat::test::CpuLimit cap(limit);
      phase = step();
    }
    INFO("limit " << limit - base << ": " << (phase.empty() ? "ran" : phase));
    failed += !phase.empty();
    CHECK(tracker.live() == base);
    CHECK(chk->host_memory().in_use_bytes == 0);
    grads();
  }
  CHECK(failed >= 5);
  // Then a step without a limit: plain autograd's gradients (BatchNorm's statistics, which the
  // failed steps updated, do not enter them in training mode).
  REQUIRE(step().empty());
  CHECK(remat::test::same_tensors(grads(), plain));
  CHECK(chk->host_memory().in_use_bytes == 0);
}

TEST_CASE("set_link checks the link, and a schedule that offloads needs one", "[runtime][offload]") {
  const torch::Tensor sample = torch::randn({4, 16});
  nn::Sequential net = fresh(16);
  remat::Checkpointable chk(net);
  chk->measure(sample, remat::ProfileOptions().measure_time(false));
  const std::int64_t full = chk->store_all_peak();
  CHECK_THROWS_AS(chk->compute_sequence(remat::SolveOptions(full).offload(true)), c10::ValueError);
  CHECK_THROWS_AS(chk->set_link(remat::Link{0.0, 10.0, 0.0}), c10::ValueError);
  CHECK_FALSE(chk->chain().link.has_value());  // nothing half-set
  chk->set_link(remat::Link{10.0, 12.0, 0.01});
  REQUIRE(chk->chain().link.has_value());
  CHECK(chk->chain().link->h2d_gbps == 12.0);
  CHECK(chk->compute_sequence(remat::SolveOptions(full).offload(true)).ok());
  chk->set_link(std::nullopt);
  CHECK_FALSE(chk->has_sequence());
  CHECK_FALSE(chk->chain().link.has_value());
}

TEST_CASE("with the loss measured, a step whose peak is the loss's holds the prediction",
          "[runtime][offload]") {
  // The CUDA test's shape on the CPU, in 512-byte units: with a batch of 256 the loss's
  // product (10 KiB) is worth a check. The chain measures the loss as square_sum runs it, the
  // product gone when the sum returns; `(out * out).sum().backward()` in one statement would
  // keep it, a C++ temporary, through the backward: 10 KiB beyond the prediction (the H200,
  // 2026-11-30, before this test).
  torch::set_num_threads(1);
  remat::test::CpuGranularity units(512);
  const torch::Tensor sample = torch::randn({256, 64});
  nn::Sequential net = fresh(64);
  remat::Checkpointable chk(net);
  chk->set_chain(offloading_chain(net, sample, square_sum));
  for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
  const std::int64_t kR = remat::runtime_reserve_bytes(torch::kCPU);
  remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(torch::kCPU);
  for (const std::int64_t budget : budgets(chk->chain(), torch::kCPU)) {
    const remat::Solution& s = chk->compute_sequence(remat::SolveOptions(budget).offload(true));
    REQUIRE(s.ok());
    const std::int64_t base = tracker.live();
    tracker.reset_peak();
    {
      torch::Tensor x = sample.clone().requires_grad_(true);
      torch::Tensor out = chk->forward(x);
      square_sum(out).backward();
    }
    const std::int64_t measured = tracker.peak() - base;
    INFO("budget " << budget << ": predicted " << s.peak_bytes << ", measured " << measured << "\n"
                   << remat::collapsed_string(s.sequence));
    CHECK(measured <= budget);
    CHECK(measured <= s.peak_bytes - kR + 3 * 512);
    CHECK(measured >= s.peak_bytes - kR - 3 * 512);
  }
}

TEST_CASE("on CUDA, offloading training equals plain training and its peak the prediction",
          "[runtime][offload][cuda]") {
  REMAT_REQUIRE_CUDA();
  // Deterministic kernels, so that a difference cannot hide behind cuBLAS's or cuDNN's order.
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/1);
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  struct Restore {
    bool was;
    ~Restore() { at::globalContext().setDeterministicAlgorithms(was, false); }
  } restore{deterministic};
  const torch::Device cuda(torch::kCUDA, 0);
  const torch::Tensor sample = torch::randn({256, 1024}).to(cuda);
  auto make = [&] {
    nn::Sequential net = fresh(1024);
    net->to(cuda);
    return net;
  };
  nn::Sequential reference = make();
  const Trained plain =
      train(*reference, [&](const torch::Tensor& x) { return reference->forward(x); }, sample);
  nn::Sequential probe = make();
  // The step's loss measured, and run as measured (its product freed before the backward).
  remat::Chain chain = offloading_chain(probe, sample, square_sum);
  int offloading = 0;
  for (const std::int64_t budget : budgets(chain, cuda)) {
    remat::Checkpointable chk = train_offloading(make, chain, budget, sample, plain);
    const remat::Solution& s = chk->solution();
    INFO("budget " << budget << ": " << remat::collapsed_string(s.sequence));
    offloading += s.simulation.offloads > 0;
    remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(cuda);
    remat::synchronize(cuda);
    const std::int64_t base = tracker.live();
    tracker.reset_peak();
    {
      torch::Tensor x = sample.clone().requires_grad_(true);
      torch::Tensor out = chk->forward(x);
      square_sum(out).backward();
    }
    remat::synchronize(cuda);
    const std::int64_t measured = tracker.peak() - base;
    INFO("predicted " << s.peak_bytes << ", measured " << measured);
    CHECK(measured <= budget);
    CHECK(measured <= s.peak_bytes - remat::runtime_reserve_bytes(cuda) + 3 * 512);
    CHECK(chk->host_memory().in_use_bytes == 0);
  }
  CHECK(offloading > 0);
}
