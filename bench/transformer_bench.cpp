// remat_transformer_bench: what stage granularity buys on GPT-2 (docs/models.md).
//
// For each model, at one batch and sequence length, on one device, in one process:
//   plain         the stages run with plain autograd (store-all), through the block chain and
//                 through the half-block chain (each chain's own store-all prediction).
//   per-block     checkpointing every stage (remat's periodic with one segment per stage at
//                 block granularity: each block's input kept, the block recomputed in the
//                 backward; what Hugging Face's gradient_checkpointing_enable() does to the
//                 blocks, applied here to the embeddings and the head too).
//   optimal/block remat's optimal schedule, one stage per block.
//   optimal/half  remat's optimal schedule, one stage per half-block (attention; MLP).
// The optimal schedules run at the per-block schedule's predicted peak (equal memory) and at
// 50% and 30% of the block chain's store-all peak; then at the least budget at which each is
// predicted to be within 10% of plain training's time ("speed budget").
// With --hf-json (the output of bench/hf_gpt2_baseline.py, run beside it at the same batch,
// sequence and device), the table also has Hugging Face's GPT2LMHeadModel, plain and after
// gradient_checkpointing_enable(), as measured there, and both optimal schedules run at
// the measured peak of Hugging Face's checkpointing (equal measured memory).
//
// A step: forward (the chain's output is the causal LM loss on random token ids), backward;
// parameter gradients allocated beforehand and zeroed in place, no optimizer step. Step time:
// the median of --steps after --warmup. Peak: the device tracker's peak during the step above
// what is live before it, plus the input, as the cost model counts it.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "bench_util.h"
#include "remat/models.h"
#include "remat/profiler.h"
#include "remat/runtime.h"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using remat::models::Granularity;

using remat::bench::median;
using remat::bench::mib;

struct Net {
  torch::nn::Sequential net;
  remat::Checkpointable chk{nullptr};
  remat::Chain chain;
};

Net make(const std::string& name, Granularity granularity, const torch::Tensor& ids,
         torch::Device device, int repeat) {
  torch::manual_seed(0);
  Net n;
  n.net = remat::models::gpt2(remat::models::gpt2_config(
      name, remat::models::GPT2Options().granularity(granularity)));
  n.net->to(device);
  n.net->train();
  for (auto& p : n.net->parameters()) p.mutable_grad() = torch::zeros_like(p);
  std::fprintf(stderr, "profiling %s (%s)...\n", name.c_str(),
               remat::models::granularity_name(granularity));
  n.chain = remat::profile(n.net, ids, remat::ProfileOptions().repeat(repeat).loss(
                                           [](const remat::Tensors& out) { return out[0]; }))
                .chain;
  n.chk = remat::Checkpointable(n.net);
  n.chk->set_chain(n.chain);
  return n;
}

struct Row {
  std::string model, method, setting;
  std::int64_t budget = 0, predicted_peak = 0, measured_peak = 0;
  double predicted_ms = 0, measured_ms = 0;
  bool oom = false;
};

/// Hugging Face's rows of `model` from bench/hf_gpt2_baseline.py's JSON: "hf-plain" and
/// "hf-checkpointing", measured only (no prediction).
std::vector<Row> hf_rows(const json& hf, const std::string& model) {
  std::vector<Row> rows;
  for (const json& r : hf.at("results")) {
    if (r.at("model") != model) continue;
    const bool checkpointing = r.at("method") == "hf-checkpointing";
    Row row{model, r.at("method").get<std::string>(),
            checkpointing ? "gradient_checkpointing_enable()" : "GPT2LMHeadModel, plain autograd"};
    row.oom = r.value("oom", false);
    if (!row.oom) {
      row.measured_ms = r.at("median_ms").get<double>();
      row.measured_peak = r.at("peak_bytes").get<std::int64_t>();
    }
    rows.push_back(row);
  }
  return rows;
}

/// Measured step time (median) and peak of `forward` on `n`.
std::pair<double, std::int64_t> measure(Net& n, const torch::Tensor& ids, torch::Device device,
                                        int steps, int warmup,
                                        const std::function<remat::Tensors(const torch::Tensor&)>& forward) {
  remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(device);
  std::vector<double> times;
  std::int64_t peak = 0;
  for (int k = 0; k < warmup + steps; ++k) {
    for (auto& p : n.net->parameters()) p.mutable_grad().zero_();
    remat::synchronize(device);
    const remat::PeakScope scope(tracker);
    const auto start = Clock::now();
    forward(ids)[0].backward();
    remat::synchronize(device);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (k < warmup) continue;
    times.push_back(ms);
    peak = std::max(peak, scope.peak_above_start());
  }
  return {median(times), peak + remat::counted_bytes(device, static_cast<std::int64_t>(ids.nbytes()))};
}

/// The least budget whose optimal schedule is predicted within `slowdown` of store-all.
std::int64_t speed_budget(Net& n, double slowdown) {
  std::int64_t lo = n.chk->min_budget(), hi = n.chk->store_all_peak();
  const double target = slowdown * n.chk->compute_sequence(hi).store_all_makespan_ms;
  while (hi - lo > (1 << 20)) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    const remat::Solution& s = n.chk->compute_sequence(mid);
    if (s.ok() && s.makespan_ms <= target) hi = mid;
    else lo = mid;
  }
  return hi;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("remat_transformer_bench: GPT-2 at block and half-block granularity against "
               "per-block checkpointing (docs/models.md)");
  std::string models = "gpt2,gpt2-medium", device_name = "cpu", json_path, markdown_path, hf_path;
  int batch = 1, sequence = 1024, steps = 2, warmup = 1, repeat = 2, threads = 0;
  app.add_option("--models", models, "Comma-separated GPT-2 configurations")->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--seq", sequence)->capture_default_str();
  app.add_option("--steps", steps, "Timed steps per configuration")->capture_default_str();
  app.add_option("--warmup", warmup)->capture_default_str();
  app.add_option("--repeat", repeat, "Profiler repetitions")->capture_default_str();
  app.add_option("--device", device_name)->capture_default_str();
  app.add_option("--threads", threads, "CPU threads for LibTorch");
  app.add_option("--json", json_path, "Write the rows as JSON");
  app.add_option("--markdown", markdown_path, "Write the table as Markdown");
  app.add_option("--hf-json", hf_path,
                 "Results of bench/hf_gpt2_baseline.py (same batch, sequence and device) to merge")
      ->check(CLI::ExistingFile);
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) torch::set_num_threads(threads);
  const torch::Device device(device_name);
  if (device.is_cuda()) remat::exact_cuda_blocks();  // plain training measured alike
  json hf;
  if (!hf_path.empty()) {
    try {
      hf = json::parse(std::ifstream(hf_path));
      if (hf.at("batch") != batch || hf.at("sequence") != sequence ||
          torch::Device(hf.at("device").get<std::string>()).type() != device.type())
        throw std::runtime_error("measured at batch " + hf.at("batch").dump() + ", sequence " +
                                 hf.at("sequence").dump() + " on " + hf.at("device").dump() +
                                 ", not at this run's");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "remat_transformer_bench: --hf-json %s: %s\n", hf_path.c_str(),
                   e.what());
      return 2;
    }
  }

  std::vector<Row> rows;
  std::stringstream names(models);
  for (std::string name; std::getline(names, name, ',');) {
    torch::manual_seed(1);
    const torch::Tensor ids =
        torch::randint(50257, {batch, sequence}, torch::TensorOptions().dtype(torch::kLong)).to(device);
    const auto run = [&](Net& n, const std::string& method, const std::string& setting,
                         const remat::Solution* s, bool plain) {
      std::fprintf(stderr, "  %s %s %s\n", name.c_str(), method.c_str(), setting.c_str());
      Row r{name, method, setting};
      r.budget = s ? s->budget_bytes : 0;
      r.predicted_peak = s ? s->peak_bytes : n.chk->store_all_peak();
      r.predicted_ms = s ? s->makespan_ms : n.chain.store_all_ms();
      try {
        std::tie(r.measured_ms, r.measured_peak) =
            measure(n, ids, device, steps, warmup, [&](const torch::Tensor& x) {
              return plain ? remat::run_stages(n.chk->stages(), {x})
                           : n.chk->forward(remat::Tensors{x});
            });
      } catch (const c10::OutOfMemoryError& error) {
        std::fprintf(stderr, "    out of memory: %s\n", error.what_without_backtrace());
        r.oom = true;
      }
      rows.push_back(r);
      if (r.oom) return;
      std::fprintf(stderr, "    predicted %s %.0f ms, measured %s %.0f ms\n",
                   mib(double(r.predicted_peak)).c_str(), r.predicted_ms,
                   mib(double(r.measured_peak)).c_str(), r.measured_ms);
    };
    Net block = make(name, Granularity::kBlock, ids, device, repeat);
    Net half = make(name, Granularity::kHalfBlock, ids, device, repeat);
    // Plain training through each chain's stages: the same computation, measured twice, and
    // each chain's own store-all prediction, which its schedules are compared with.
    run(block, "plain", "store-all (block chain)", nullptr, true);
    run(half, "plain", "store-all (half-block chain)", nullptr, true);
    const remat::Solution per_block = block.chk->compute_sequence(
        remat::SolveOptions(block.chk->store_all_peak())
            .algorithm(remat::Algorithm::kPeriodic)
            .segments(block.chain.length()));
    run(block, "per-block", "every stage", &per_block, false);
    const std::int64_t store_all = block.chk->store_all_peak();
    std::vector<std::pair<std::string, std::int64_t>> budgets = {
        {"= per-block peak", per_block.peak_bytes},
        {"50% of store-all", store_all / 2},
        {"30% of store-all", store_all * 3 / 10}};
    if (!hf.is_null()) {
      const std::vector<Row> theirs = hf_rows(hf, name);
      if (theirs.empty())
        std::fprintf(stderr, "  %s: not in --hf-json %s\n", name.c_str(), hf_path.c_str());
      for (const Row& r : theirs) {
        rows.push_back(r);
        if (r.method == "hf-checkpointing" && !r.oom)
          budgets.insert(budgets.begin(), {"= HF checkpointing's measured peak", r.measured_peak});
      }
    }
    for (Net* n : {&block, &half}) {
      const std::string method =
          n == &block ? "optimal/block" : "optimal/half";
      for (const auto& [setting, budget] : budgets) {
        const remat::Solution s = n->chk->compute_sequence(budget);
        if (!s.ok()) {
          std::fprintf(stderr, "  %s %s: infeasible (needs %s)\n", method.c_str(), setting.c_str(),
                       mib(double(s.min_feasible_budget_bytes)).c_str());
          Row r{name, method, setting + " (infeasible)"};
          r.budget = budget;
          r.predicted_peak = s.min_feasible_budget_bytes;
          rows.push_back(r);
          continue;
        }
        run(*n, method, setting, &s, false);
      }
      const std::int64_t fast = speed_budget(*n, 1.10);
      const remat::Solution s = n->chk->compute_sequence(fast);
      run(*n, method, "speed budget (+10%)", &s, false);
    }
  }

  std::ostringstream md;
  md << "| model | schedule | budget | predicted peak | measured peak | predicted step | measured step | vs plain |\n"
     << "|---|---|---|---:|---:|---:|---:|---:|\n";
  for (const Row& r : rows) {
    // Against the first plain row of the model (the block chain's).
    double plain_ms = 0;
    for (const Row& p : rows)
      if (p.model == r.model && p.method == "plain" && plain_ms == 0) plain_ms = p.measured_ms;
    const bool ran = r.measured_ms > 0, predicted = r.predicted_ms > 0;
    const auto ms = [](double v) { return std::to_string(static_cast<long>(v)) + " ms"; };
    const auto percent = [](double v) {
      return std::to_string(static_cast<int>(100 * v + (v >= 0 ? 0.5 : -0.5))) + "%";
    };
    md << "| " << r.model << " | " << r.method << " | " << r.setting
       << (r.budget > 0 ? " (" + mib(double(r.budget)) + ")" : "") << " | "
       << (r.predicted_peak > 0 ? mib(double(r.predicted_peak)) : "-") << " | "
       << (r.oom ? "out of memory"
           : ran ? mib(double(r.measured_peak))
                 : "-")
       << " | " << (predicted && (ran || r.oom) ? ms(r.predicted_ms) : "-") << " | "
       << (ran ? ms(r.measured_ms) : "-") << " | "
       << (ran && plain_ms > 0 ? percent(r.measured_ms / plain_ms - 1) : "-") << " |\n";
  }
  std::printf("GPT-2, batch %d, sequence %d, %s, LibTorch %s, %d threads: median of %d steps after %d\n\n%s",
              batch, sequence, device_name.c_str(), TORCH_VERSION, torch::get_num_threads(), steps,
              warmup, md.str().c_str());
  if (!markdown_path.empty()) std::ofstream(markdown_path) << md.str();
  if (!json_path.empty()) {
    json out = json::array();
    for (const Row& r : rows)
      out.push_back({{"model", r.model},
                     {"method", r.method},
                     {"setting", r.setting},
                     {"budget", r.budget},
                     {"predicted_peak", r.predicted_peak},
                     {"measured_peak", r.measured_peak},
                     {"predicted_ms", r.predicted_ms},
                     {"measured_ms", r.measured_ms},
                     {"oom", r.oom}});
    std::ofstream(json_path) << json{{"batch", batch}, {"sequence", sequence}, {"device", device_name},
                                     {"libtorch", TORCH_VERSION}, {"rows", out}}.dump(2) << "\n";
  }
  return 0;
}
