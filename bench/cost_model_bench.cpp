// remat_cost_model_bench: what cost model v2 (every storage counted once, only what each
// backward keeps) changes against model v1 (each stage keeps its whole input and output until
// its backward), on networks with one layer per stage (bench/per_layer_nets.h).
//
// For each network it profiles the chain once (model v2), and derives model v1's view of the
// same measurements: each stage keeps its output and its autograd state until its backward
// (Stage::keeping_all, what remat-chain/1 files describe). For both it prints the store-all
// peak, the least feasible budget, and the optimal schedule's predicted step time at 50% of
// plain autograd's peak (measured here). Model v2's schedule at that budget is then run by the
// runtime, and its measured peak and median step time are printed too (model v1's runtime no
// longer exists: its figures are predictions).
//
// Usage: remat_cost_model_bench [--steps N]

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "per_layer_nets.h"
#include "remat/profiler.h"
#include "remat/runtime.h"

namespace {

using Clock = std::chrono::steady_clock;

using remat::bench::median;

// Model v1's view of a chain of one-tensor stages measured under model v2: every stage keeps
// its whole input and output and its autograd state until its backward.
remat::Chain as_model_v1(const remat::Chain& v2) {
  remat::Chain v1;
  v1.name = v2.name + " (model v1)";
  v1.set_input(v2.input_bytes());
  v1.loss_tmp_bytes = v2.loss_tmp_bytes;
  for (const remat::Stage& s : v2.stages) {
    remat::Stage stage = remat::Stage::keeping_all(s.name, s.out_bytes(), s.out_bytes() + s.state_bytes);
    stage.fwd_ms = s.fwd_ms;
    stage.bwd_ms = s.bwd_ms;
    stage.fwd_nograd_ms = s.fwd_nograd_ms;
    stage.fwd_tmp_bytes = s.fwd_tmp_bytes;
    stage.fwd_nograd_tmp_bytes = s.fwd_nograd_tmp_bytes;
    stage.bwd_tmp_bytes = s.bwd_tmp_bytes;
    v1.stages.push_back(std::move(stage));
  }
  v1.validate("model v1 view");
  return v1;
}

struct Measured {
  std::int64_t peak = 0;  // the largest over the steps
  double median_ms = 0;
};

// `steps` training steps after one warm-up (a sum-of-products loss whose gradient is a full
// tensor): the peak above what was live before each step, and the median step time.
template <class Forward>
Measured measure_steps(Forward forward, const torch::Tensor& sample, const torch::Tensor& weight,
                       int steps) {
  remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(torch::kCPU);
  Measured out;
  std::vector<double> ms;
  for (int k = 0; k <= steps; ++k) {
    const std::int64_t base = tracker.live();
    tracker.reset_peak();
    const auto start = Clock::now();
    {
      const torch::Tensor x = sample.clone();
      torch::Tensor loss = (forward(x) * weight).sum();
      loss.backward();
    }
    out.peak = std::max(out.peak, tracker.peak() - base);
    if (k > 0)
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  out.median_ms = median(ms);
  return out;
}

std::string mib(std::int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 11;
  for (int k = 1; k < argc; ++k) {
    if (std::strcmp(argv[k], "--steps") == 0 && k + 1 < argc) {
      steps = std::max(1, std::atoi(argv[++k]));
    } else {
      std::fprintf(stderr, "usage: remat_cost_model_bench [--steps N]\n");
      return 2;
    }
  }
  remat::keep_freed_memory();
  struct Case {
    std::string name;
    torch::nn::Sequential net;
    torch::Tensor sample;
  };
  torch::manual_seed(0);
  std::vector<Case> cases;
  cases.push_back({"per-layer CNN (44 stages), b16 3x64x64", remat::bench::per_layer_cnn(32, 4),
                   torch::randn({16, 3, 64, 64})});
  cases.push_back({"per-layer transformer, 4 blocks (41 stages), b8 x 128 x 256",
                   remat::bench::per_layer_transformer(256, 4), torch::randn({8, 128, 256})});
  std::printf("Machine: %d LibTorch threads, CPU; times: median of %d steps.\n\n",
              torch::get_num_threads(), steps);
  std::printf("| network | model | store-all peak | least budget | optimal at 50%% of plain: predicted ms (vs store-all) | measured peak | measured ms |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|\n");
  for (Case& c : cases) {
    std::fprintf(stderr, "%s: profiling\n", c.name.c_str());
    torch::nn::Sequential& net = c.net;
    for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
    torch::Tensor weight;
    {
      torch::NoGradGuard no_grad;
      weight = torch::ones_like(net->forward(c.sample));
    }
    const Measured plain = measure_steps([&](const torch::Tensor& x) { return net->forward(x); },
                                         c.sample, weight, steps);
    remat::Checkpointable chk(net);
    const remat::Chain v2 = chk->measure(c.sample);
    const remat::Chain v1 = as_model_v1(v2);
    const std::int64_t half = plain.peak / 2;
    std::printf("| %s | plain autograd (measured) | %s | | | %s | %.2f |\n", c.name.c_str(),
                mib(plain.peak).c_str(), mib(plain.peak).c_str(), plain.median_ms);
    // Both models through the Checkpointable: its figures include the runtime's reserve.
    for (const remat::Chain* chain : {&v1, &v2}) {
      const bool is_v2 = chain == &v2;
      chk->set_chain(*chain);
      const remat::Solution& s = chk->compute_sequence(half);
      std::string at_half = "infeasible";
      if (s.ok()) {
        char text[64];
        std::snprintf(text, sizeof text, "%.2f (%+.1f%%)", s.makespan_ms,
                      100 * (s.makespan_ms / s.store_all_makespan_ms - 1));
        at_half = text;
      }
      std::string measured_peak, measured_ms;
      if (is_v2 && s.ok()) {
        const Measured m = measure_steps([&](const torch::Tensor& x) { return chk->forward(x); },
                                         c.sample, weight, steps);
        measured_peak = mib(m.peak);
        char text[32];
        std::snprintf(text, sizeof text, "%.2f", m.median_ms);
        measured_ms = text;
      }
      std::printf("| %s | %s | %s | %s | %s | %s | %s |\n", c.name.c_str(),
                  is_v2 ? "v2 (remat-chain/2)" : "v1 (keeps every input and output)",
                  mib(chk->store_all_peak()).c_str(), mib(chk->min_budget()).c_str(),
                  at_half.c_str(), measured_peak.c_str(), measured_ms.c_str());
    }
  }
  return 0;
}
