// remat_runtime_bench: the runtime's step time on CPU against plain autograd and against the
// predicted makespan.
//
// For each built-in network it profiles the chain, then times training steps (forward and
// backward of a sum loss; parameter gradients kept allocated; median of --steps after a
// warm-up) for: plain autograd; the runtime with the store-all schedule (the runtime's own
// overhead); and optimal schedules at 75%, 50% and the least feasible budget. Plain and
// runtime steps alternate, so that drifts of the machine affect both alike.
//
// With --overhead, instead: the runtime's own host time per stage, on a chain of tiny stages
// (Linear(16, 16) and ReLU at batch 1) whose kernels cost next to nothing, so that a step is
// the host's work alone: what a GPU waits for when its step is bound by the host launching
// kernels (docs/performance.md). Store-all through the runtime against plain autograd.
//
// Usage: remat_runtime_bench [--quick] [--steps N] [--malloc-defaults] [--overhead]

#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "remat/models.h"
#include "remat/profiler.h"
#include "remat/runtime.h"

namespace {

using Clock = std::chrono::steady_clock;

using remat::bench::median;

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// One step's wall time; adds the step's minor page faults to *faults.
template <class Forward>
double step_ms(Forward forward, const torch::Tensor& sample, std::vector<double>* faults = nullptr) {
  const long faults_before = minor_faults();
  const auto start = Clock::now();
  {
    torch::Tensor loss = torch::zeros({});
    for (const torch::Tensor& out : forward(sample.clone())) loss = loss + out.sum();
    loss.backward();
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  if (faults != nullptr) faults->push_back(static_cast<double>(minor_faults() - faults_before));
  return ms;
}

// Steps of the runtime under its current schedule and of plain autograd through the same
// stages, alternating after a warm-up step of each, so that drifts of the machine affect both
// alike: their times in ms, and their minor page faults per step.
struct Alternated {
  std::vector<double> ours, plain, ours_faults, plain_faults;
  std::vector<double> unfused;  // with `unfused`: the runtime making one backward call per stage
};
Alternated alternate(remat::Checkpointable& chk, const torch::Tensor& sample, int steps,
                     bool unfused = false) {
  auto ours = [&](const torch::Tensor& x) { return chk->forward(remat::Tensors{x}); };
  auto plain = [&](const torch::Tensor& x) { return remat::run_stages(chk->stages(), {x}); };
  Alternated r;
  step_ms(ours, sample);
  step_ms(plain, sample);
  for (int k = 0; k < steps; ++k) {
    r.ours.push_back(step_ms(ours, sample, &r.ours_faults));
    r.plain.push_back(step_ms(plain, sample, &r.plain_faults));
    if (unfused) {
      const remat::detail::FuseBackwardCalls per_stage_calls(false);
      r.unfused.push_back(step_ms(ours, sample));
    }
  }
  return r;
}

// --overhead: microseconds a step and per stage, plain autograd against store-all through the
// runtime, for chains of `lengths` tiny stages.
int overhead(int steps) {
  std::printf(
      "Host time of a step of tiny stages (Linear(16, 16), ReLU; batch 1): %d LibTorch "
      "threads; median of %d steps after a warm-up, plain and runtime alternating.\n\n",
      torch::get_num_threads(), steps);
  std::printf(
      "| stages | plain us | store-all us | runtime's own us per stage "
      "| store-all, a backward call per stage, us | store-all predicted us | optimal 50%% us |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const int length : {16, 64, 256}) {
    torch::manual_seed(0);
    torch::nn::Sequential net;
    for (int k = 0; k < length; ++k) {
      if (k % 2 == 0)
        net->push_back(torch::nn::Linear(16, 16));
      else
        net->push_back(torch::nn::ReLU());
    }
    for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
    const torch::Tensor sample = torch::randn({1, 16});
    remat::Checkpointable chk(net);
    chk->measure(sample);
    const double predicted =
        chk->compute_sequence(chk->store_all_peak(), remat::Algorithm::kStoreAll).makespan_ms;
    const Alternated all = alternate(chk, sample, steps, /*unfused=*/true);
    chk->compute_sequence(std::max(chk->min_budget(), chk->store_all_peak() / 2));
    const Alternated half = alternate(chk, sample, steps);
    const double p = median(all.plain) * 1e3, a = median(all.ours) * 1e3,
                 h = median(half.ours) * 1e3;
    std::printf("| %d | %.0f | %.0f | %.2f | %.0f | %.0f | %.0f |\n", length, p, a,
                (a - p) / length, median(all.unfused) * 1e3, predicted * 1e3, h);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, malloc_defaults = false, host_overhead = false;
  int steps = 9;
  for (int k = 1; k < argc; ++k) {
    const std::string flag = argv[k];
    if (flag == "--quick") {
      quick = true;
    } else if (flag == "--malloc-defaults") {
      malloc_defaults = true;
    } else if (flag == "--overhead") {
      host_overhead = true;
    } else if (flag == "--steps" && k + 1 < argc) {
      steps = std::max(1, std::stoi(argv[++k]));
    } else {
      std::fprintf(
          stderr,
          "usage: remat_runtime_bench [--quick] [--steps N] [--malloc-defaults] [--overhead]\n");
      return 2;
    }
  }
  if (host_overhead) {
    if (!malloc_defaults) remat::keep_freed_memory();
    return overhead(steps);
  }
  struct Case {
    std::string model;
    int batch, image;
  };
  std::vector<Case> cases = {{"convnet", 16, 64}};
  if (!quick) cases.push_back({"convnet-deep", 16, 64});
  // As the remat commands do (remat::keep_freed_memory); both plain and runtime steps run
  // under the same setting.
  if (!malloc_defaults) remat::keep_freed_memory();
  std::printf("Machine: %d LibTorch threads; median of %d steps after a warm-up; %s.\n\n",
              torch::get_num_threads(), steps,
              malloc_defaults ? "glibc's default malloc" : "remat::keep_freed_memory()");
  std::printf("| network | schedule | budget | predicted peak | predicted ms | measured ms | measured / predicted | measured / plain | page faults per step (plain) |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Case& c : cases) {
    torch::manual_seed(0);
    torch::nn::Sequential net = remat::models::find_model(c.model).make(10);
    const torch::Tensor sample = torch::randn({c.batch, 3, c.image, c.image});
    for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
    remat::Checkpointable chk(net);
    chk->measure(sample);
    const std::int64_t full = chk->store_all_peak();
    const std::int64_t least = chk->min_budget();
    struct Schedule {
      std::string name;
      remat::Algorithm algorithm;
      std::int64_t budget;
    };
    const std::vector<Schedule> schedules = {
        {"store-all", remat::Algorithm::kStoreAll, full},
        {"optimal 75%", remat::Algorithm::kOptimal, std::max(least, full * 3 / 4)},
        {"optimal 50%", remat::Algorithm::kOptimal, std::max(least, full / 2)},
        {"optimal, least budget", remat::Algorithm::kOptimal, least}};
    const std::string name = c.model + " b" + std::to_string(c.batch) + " " +
                             std::to_string(c.image) + "x" + std::to_string(c.image);
    for (const Schedule& s : schedules) {
      const remat::Solution& solution = chk->compute_sequence(s.budget, s.algorithm);
      const Alternated steps_of = alternate(chk, sample, steps);
      const double measured = median(steps_of.ours), base = median(steps_of.plain);
      std::printf("| %s | %s | %.2f MiB | %.2f MiB | %.1f | %.1f | %.3f | %.3f | %.0f (%.0f) |\n",
                  name.c_str(), s.name.c_str(), static_cast<double>(s.budget) / (1 << 20),
                  static_cast<double>(solution.peak_bytes) / (1 << 20), solution.makespan_ms,
                  measured, measured / solution.makespan_ms, measured / base,
                  median(steps_of.ours_faults), median(steps_of.plain_faults));
      std::fflush(stdout);
    }
  }
  return 0;
}
