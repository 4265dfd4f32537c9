// remat_training_bench: the measurements of the GPU check (scripts/gpu-check.sh), on any device.
//
//   fidelity    For each model: profile it, then train with the optimal schedule at budgets
//               that are percentages of its store-all activation peak. Measured peak activation
//               bytes against the budget and the prediction, measured step time against the
//               predicted makespan.
//   throughput  For one model, in one process: plain LibTorch, remat optimal at budgets,
//               remat periodic for every segment count from 2 to 2 sqrt(L) (the schedule of
//               checkpoint_sequential, in remat's runtime), store-all with one backward call
//               per stage (remat-per-stage-backward); with --pytorch-json, the results
//               of bench/pytorch_baseline.py on the same network (plain PyTorch and
//               checkpoint_sequential) are merged in: for each remat budget, the fastest
//               checkpoint_sequential whose measured peak does not exceed remat's.
//
// A step: forward, cross-entropy on random labels (Inception's training output: logits +
// 0.4 aux logits, torchvision's recipe), backward; parameter gradients allocated beforehand
// and zeroed in place, no optimizer step. Step time: the median of --steps after --warmup,
// the device synchronized before and after. Peak activation bytes: the device tracker's peak
// during the step above what is live before it (parameters, gradients, the batch); the
// fidelity table adds the batch, which the cost model counts.
//
// Out of memory in one configuration is recorded ("oom") and the others go on.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "remat/models.h"
#include "remat/profiler.h"
#include "remat/report.h"
#include "remat/runtime.h"

namespace {

// How the profiles take their times (--timing); the same for every model of a run.
remat::Timing profile_timing = remat::Timing::kAuto;
// Where each profiled chain is saved (--chains; empty: not saved), and the first part of its
// file's name (the subcommand): offline, `remat schedule --chain FILE` solves it again, and
// what-if analyses of the solver run on a GPU's measured costs without a GPU.
std::string chains_dir, chains_prefix;

using Clock = std::chrono::steady_clock;
using nlohmann::json;

using remat::bench::median;
using remat::bench::mib;

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// One model on one device, ready to train.
struct Setup {
  std::string name;
  torch::Device device{torch::kCPU};
  int batch = 0, image = 0, classes = 1000;
  torch::nn::Sequential net{nullptr};
  torch::Tensor sample, target;
  remat::Chain chain;

  // `model` is a registry name, or NAME@GRANULARITY for another granularity than the block
  // (inception_v3@branch).
  Setup(const std::string& model, torch::Device dev, int batch_, int image_)
      : name(model), device(dev), batch(batch_) {
    const std::size_t at = model.find('@');
    const remat::models::ModelInfo& info = remat::models::find_model(model.substr(0, at));
    remat::models::ModelConfig config;
    config.num_classes = classes;
    if (at != std::string::npos)
      config.granularity = remat::models::parse_granularity(model.substr(at + 1));
    image = image_ > 0 ? image_ : info.default_image;
    config.image = image;
    torch::manual_seed(0);
    net = info.build(config);
    net->to(device);
    net->train();
    for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
    const auto options = torch::TensorOptions().device(device);
    sample = torch::randn({batch, 3, image, image}, options);
    target = torch::randint(classes, {batch}, options.dtype(torch::kLong));
  }
  std::string label() const {
    return name + " b" + std::to_string(batch) + " " + std::to_string(image) + "x" +
           std::to_string(image) + " " + device.str();
  }
  void profile(int repeat) {
    std::fprintf(stderr, "%s: profiling\n", label().c_str());
    // The steps below let the output go once the loss has its value (output_held false).
    chain = remat::profile(net, sample,
                           remat::ProfileOptions()
                               .repeat(repeat)
                               .timing(profile_timing)
                               .name(label())
                               .loss([this](const remat::Tensors& out) { return loss(out); })
                               .output_held(false))
                .chain;
    if (chains_dir.empty()) return;
    std::string file = chains_prefix + "-" + name + "-b" + std::to_string(batch) + "-" +
                       std::to_string(image) + "-" + remat::timing_name(profile_timing) + ".json";
    std::replace(file.begin(), file.end(), '@', '-');
    std::filesystem::create_directories(chains_dir);
    remat::save_chain(chain, (std::filesystem::path(chains_dir) / file).string());
  }
  torch::Tensor loss(const remat::Tensors& out) const {
    return remat::models::classification_loss(out, target);
  }
};

struct Measured {
  bool oom = false;
  std::vector<double> step_ms;
  std::int64_t peak_bytes = 0;  // the largest over the steps
  // CUDA only (-1 elsewhere), the caching allocator's view (remat::CudaAllocatorStats), for
  // telling apart the causes of a gap: the peak of the tensors' exact sizes above the start
  // of the step, and the largest the allocator's reserved segments and its live blocks
  // reached in all (parameters and cache included).
  std::int64_t requested_peak_bytes = -1, reserved_bytes = -1, allocated_total_bytes = -1;
  // CUDA only, per timed step: the allocator's calls of cudaMalloc and its retries after
  // freeing its cache (each waits for the GPU), to tell a slow step's cause.
  std::vector<std::int64_t> step_device_allocs, step_alloc_retries;
  double median_ms() const { return step_ms.empty() ? 0 : median(step_ms); }
};

// Adds `steps` timed steps after `warmup` untimed ones to `m` (the peaks: the largest so far).
// Out of memory: `m` is reset and marked so.
void measure_more(Measured& m, Setup& s,
                  const std::function<remat::Tensors(const torch::Tensor&)>& forward, int steps,
                  int warmup) {
  remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(s.device);
  try {
    for (int k = 0; k < warmup + steps; ++k) {
      for (auto& p : s.net->parameters()) p.mutable_grad().zero_();
      remat::synchronize(s.device);
      const remat::PeakScope scope(tracker);
      std::int64_t requested_start = 0;
      remat::CudaAllocatorStats start_stats;
      if (s.device.is_cuda()) {
        start_stats = remat::cuda_allocator_stats(s.device);
        requested_start = start_stats.requested;
      }
      const auto start = Clock::now();
      // The output is let go once the loss has its value, as the chain says (profile()).
      torch::Tensor loss = s.loss(forward(s.sample));
      loss.backward();
      remat::synchronize(s.device);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      if (k < warmup) continue;
      m.step_ms.push_back(ms);
      m.peak_bytes = std::max(m.peak_bytes, scope.peak_above_start());
      if (s.device.is_cuda()) {
        const remat::CudaAllocatorStats stats = remat::cuda_allocator_stats(s.device);
        if (stats.requested >= 0)
          m.requested_peak_bytes =
              std::max(m.requested_peak_bytes, stats.requested_peak - requested_start);
        m.reserved_bytes = std::max(m.reserved_bytes, stats.reserved_peak);
        m.allocated_total_bytes = std::max(m.allocated_total_bytes, stats.allocated_peak);
        m.step_device_allocs.push_back(stats.device_allocs - start_stats.device_allocs);
        m.step_alloc_retries.push_back(stats.alloc_retries - start_stats.alloc_retries);
      }
    }
  } catch (const c10::OutOfMemoryError& error) {
    std::fprintf(stderr, "  out of memory: %s\n", error.what_without_backtrace());
    m = Measured();
    m.oom = true;
  }
}

Measured measure(Setup& s, const std::function<remat::Tensors(const torch::Tensor&)>& forward,
                 int steps, int warmup) {
  Measured m;
  measure_more(m, s, forward, steps, warmup);
  return m;
}

// Rounds in which configurations take turns, as bench/pytorch_baseline.py's round_plan: at
// most `steps` rounds; round r runs steps / rounds timed steps (one more in the first
// steps % rounds), after `warmup` untimed ones in the first round and min(1, warmup) later
// (the allocator's cache and the caches of the GPU were another configuration's).
struct Round {
  int warmup, steps;
};
std::vector<Round> round_plan(int steps, int warmup, int rounds) {
  rounds = std::min(rounds, steps);
  std::vector<Round> plan;
  for (int r = 0; r < rounds; ++r)
    plan.push_back({r == 0 ? warmup : std::min(1, warmup), steps / rounds + (r < steps % rounds)});
  return plan;
}

// The allocator's calls per timed step, on a GPU, into a fidelity row.
void add_allocator_calls(const Measured& m, json& row) {
  if (m.step_device_allocs.empty()) return;
  row["step_device_allocs"] = m.step_device_allocs;
  row["step_alloc_retries"] = m.step_alloc_retries;
}

// One more step of `chk`'s schedule, traced (CheckpointableImpl::trace_next_step): where its
// time goes, operation by operation, against the prediction. Empty on out of memory.
json traced_step(Setup& s, remat::Checkpointable& chk) {
  std::int64_t device_allocs = -1;
  try {
    for (auto& p : s.net->parameters()) p.mutable_grad().zero_();
    remat::synchronize(s.device);
    const std::int64_t allocs_before =
        s.device.is_cuda() ? remat::cuda_allocator_stats(s.device).device_allocs : -1;
    chk->trace_next_step();
    s.loss(chk->forward(remat::Tensors{s.sample})).backward();
    remat::synchronize(s.device);
    if (s.device.is_cuda())
      device_allocs = remat::cuda_allocator_stats(s.device).device_allocs - allocs_before;
  } catch (const c10::OutOfMemoryError&) {
    return json();
  }
  const std::vector<remat::TracedOperation>& trace = chk->last_trace();
  const remat::TraceSummary sum = remat::summarize_trace(trace);
  const auto part = [](const remat::TraceSummary::Part& p) {
    return json{{"operations", p.operations},
                {"predicted_ms", p.predicted_ms},
                {"measured_ms", p.measured_ms}};
  };
  json operations = json::array();
  for (const remat::TracedOperation& op : trace)
    operations.push_back({{"operations", op.label},
                          {"start_ms", op.start_ms},
                          {"measured_ms", op.measured_ms},
                          {"predicted_ms", op.predicted_ms}});
  return json{{"forward", part(sum.forward)},     {"loss", part(sum.loss)},
              {"recompute", part(sum.recompute)}, {"backward", part(sum.backward)},
              {"copy", part(sum.copy)},
              {"between_ms", sum.between_ms},     {"caller_ms", sum.caller_ms},
              {"measured_ms", sum.measured_ms},   {"predicted_ms", sum.predicted_ms},
              {"device_allocs", device_allocs},   {"operations", operations}};
}

// `count` traced steps (traced_step), in order: steps vary (some run as predicted, others
// slower), so one traced step alone may be the exception. Empty on out of memory.
json traced_steps(Setup& s, remat::Checkpointable& chk, int count) {
  json steps = json::array();
  for (int k = 0; k < count; ++k) {
    json step = traced_step(s, chk);
    if (step.is_null()) return json();
    steps.push_back(std::move(step));
  }
  return steps;
}

// The step whose measured time is the median of `steps` (the lower one of an even count).
const json& median_step(const json& steps) {
  std::vector<std::size_t> order(steps.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return steps[a]["measured_ms"].get<double>() < steps[b]["measured_ms"].get<double>();
  });
  return steps[order[(order.size() - 1) / 2]];
}

// "predicted / measured" of one part of a traced step, for the tables.
std::string part_cell(const json& part) {
  char cell[64];
  std::snprintf(cell, sizeof cell, "%.1f / %.1f", part["predicted_ms"].get<double>(),
                part["measured_ms"].get<double>());
  return cell;
}

void write_file(const std::string& path, const std::string& text) {
  if (!path.empty()) remat::write_text_file(path, text);
}

std::string device_name(torch::Device device) {
  return device.is_cuda() ? "CUDA " + device.str()
                          : "CPU, " + std::to_string(torch::get_num_threads()) + " LibTorch threads";
}

// ---- fidelity ----

int fidelity(const std::vector<std::string>& models, torch::Device device, int batch, int image,
             const std::vector<double>& budgets, int steps, int warmup, int rounds, int repeat,
             int traced, const std::string& json_path, const std::string& markdown_path) {
  std::ostringstream md;
  md << "Fidelity on " << device_name(device) << ", LibTorch " << TORCH_VERSION
     << ": median of " << steps << " steps after " << warmup
     << (rounds > 1 ? ", plain training and the schedules taking turns in " +
                          std::to_string(std::min(rounds, steps)) +
                          " rounds (one untimed step each after the first)"
                    : std::string())
     << ". Peak = activation bytes "
     << "(allocator statistics above parameters and gradients, the batch included).\n\n"
     << "| model | budget | budget bytes | predicted peak | measured peak | measured / predicted | "
        "within budget | predicted ms | measured ms | measured / predicted |\n"
     << "|---|---:|---:|---:|---:|---:|:---:|---:|---:|---:|\n";
  json rows = json::array(), plain_rows = json::array();
  std::ostringstream plain_md, allocator_md, trace_md;
  bool all_within = true;
  const std::vector<Round> plan = round_plan(steps, warmup, rounds);
  for (const std::string& model : models) {
    Setup s(model, device, batch, image);
    s.profile(repeat);
    // Plain training through the same stages (entry 0), then each feasible budget's schedule,
    // each with a Checkpointable of its own on the same network, so that they can take turns.
    // Plain's time against the store-all prediction shows how far the profile's times are
    // from a step's before any schedule is involved.
    const std::vector<remat::NamedStage> stages = remat::stages_of(s.net);
    struct Entry {
      std::string what;  // "plain", "optimal at 75% of store-all"
      std::function<remat::Tensors(const torch::Tensor&)> forward;
      remat::Checkpointable chk{nullptr};  // none for plain
      Measured m;
    };
    std::vector<Entry> entries;
    entries.push_back({"plain",
                       [&](const torch::Tensor& x) { return remat::run_stages(stages, {x}); },
                       nullptr, Measured()});
    remat::Checkpointable first(s.net);
    first->set_chain(s.chain);
    // Percentages of the store-all peak as the runtime needs it (its reserve included).
    const std::int64_t store_all = first->store_all_peak();
    std::vector<json> budget_rows;
    for (double percent : budgets) {
      const auto budget =
          static_cast<std::int64_t>(std::llround(percent / 100 * static_cast<double>(store_all)));
      json row = {{"model", s.label()}, {"percent", percent}, {"budget_bytes", budget}};
      remat::Checkpointable chk(s.net);
      chk->set_chain(s.chain);
      const remat::Solution& solution = chk->compute_sequence(budget);
      if (!solution.ok()) {
        row["infeasible"] = true;
        row["min_budget_bytes"] = solution.min_feasible_budget_bytes;
      } else {
        row["predicted_peak_bytes"] = solution.peak_bytes;
        row["predicted_ms"] = solution.makespan_ms;
        char what[64];
        std::snprintf(what, sizeof what, "optimal at %.0f%% of store-all", percent);
        entries.push_back(
            {what,
             [chk](const torch::Tensor& x) mutable { return chk->forward(remat::Tensors{x}); },
             chk, Measured()});
      }
      budget_rows.push_back(std::move(row));
    }
    for (std::size_t r = 0; r < plan.size(); ++r) {
      for (Entry& e : entries) {
        if (e.m.oom) continue;
        std::fprintf(stderr, "%s: %s", s.label().c_str(), e.what.c_str());
        if (plan.size() > 1) std::fprintf(stderr, " (round %zu of %zu)", r + 1, plan.size());
        std::fprintf(stderr, "\n");
        measure_more(e.m, s, e.forward, plan[r].steps, plan[r].warmup);
      }
    }
    {
      const Measured& m = entries[0].m;
      const double predicted_ms = s.chain.store_all_ms();
      json row = {{"model", s.label()}, {"predicted_ms", predicted_ms}, {"oom", m.oom}};
      if (!m.oom) {
        const std::int64_t measured = m.peak_bytes + s.chain.input_bytes();
        row["measured_ms"] = m.median_ms();
        row["step_ms"] = m.step_ms;
        add_allocator_calls(m, row);
        row["measured_peak_bytes"] = measured;
        char line[256];
        std::snprintf(line, sizeof line, "| %s | %.1f | %.1f | %.3f | %s |\n", s.label().c_str(),
                      predicted_ms, m.median_ms(), m.median_ms() / predicted_ms,
                      mib(static_cast<double>(measured)).c_str());
        plain_md << line;
      }
      plain_rows.push_back(row);
    }
    std::size_t next = 1;  // the entry of the next feasible budget
    for (json& row : budget_rows) {
      const double percent = row["percent"].get<double>();
      const std::int64_t budget = row["budget_bytes"].get<std::int64_t>();
      if (row.contains("infeasible")) {
        md << "| " << s.label() << " | " << percent << "% | " << mib(budget)
           << " | infeasible (needs " << mib(row["min_budget_bytes"].get<std::int64_t>())
           << ") | | | | | | |\n";
        rows.push_back(row);
        continue;
      }
      Entry& e = entries[next++];
      const Measured& m = e.m;
      const std::int64_t predicted_peak = row["predicted_peak_bytes"].get<std::int64_t>();
      const double predicted_ms = row["predicted_ms"].get<double>();
      if (m.oom) {
        row["oom"] = true;
        all_within = false;
        md << "| " << s.label() << " | " << percent << "% | " << mib(budget) << " | "
           << mib(predicted_peak) << " | out of memory | | no | | | |\n";
        rows.push_back(row);
        continue;
      }
      const std::int64_t measured = m.peak_bytes + s.chain.input_bytes();
      const bool within = measured <= budget;
      all_within = all_within && within;
      row["measured_peak_bytes"] = measured;
      row["step_ms"] = m.step_ms;
      add_allocator_calls(m, row);
      row["measured_ms"] = m.median_ms();
      row["within_budget"] = within;
      if (m.reserved_bytes >= 0) {
        // The exact sizes, the input's included as the cost model counts it (its bytes).
        const std::int64_t requested =
            m.requested_peak_bytes >= 0 ? m.requested_peak_bytes + s.sample.nbytes() : -1;
        row["requested_peak_bytes"] = requested;
        row["reserved_bytes"] = m.reserved_bytes;
        row["allocated_total_bytes"] = m.allocated_total_bytes;
        char line[256];
        std::snprintf(line, sizeof line, "| %s | %.0f%% | %s | %s | %s | %s |\n", s.label().c_str(),
                      percent, mib(static_cast<double>(measured)).c_str(),
                      requested >= 0 ? mib(static_cast<double>(requested)).c_str() : "-",
                      mib(static_cast<double>(m.allocated_total_bytes)).c_str(),
                      mib(static_cast<double>(m.reserved_bytes)).c_str());
        allocator_md << line;
      }
      char line[512];
      std::snprintf(line, sizeof line, "| %s | %.0f%% | %s | %s | %s | %.3f | %s | %.1f | %.1f | %.3f |\n",
                    s.label().c_str(), percent, mib(static_cast<double>(budget)).c_str(),
                    mib(static_cast<double>(predicted_peak)).c_str(),
                    mib(static_cast<double>(measured)).c_str(),
                    static_cast<double>(measured) / static_cast<double>(predicted_peak),
                    within ? "yes" : "**NO**", predicted_ms, m.median_ms(),
                    m.median_ms() / predicted_ms);
      md << line;
      std::printf("%s", line);
      std::fflush(stdout);
      // The traced steps come after the other schedules' steps: one untimed step first.
      if (traced > 0 && warmup > 0) {
        Measured untimed;
        measure_more(untimed, s, e.forward, 0, 1);
      }
      const json traces = traced_steps(s, e.chk, traced);
      if (!traces.is_null() && !traces.empty()) {
        const json& trace = median_step(traces);
        row["trace"] = trace;
        row["traces"] = traces;
        char text[512];
        std::snprintf(
            text, sizeof text, "| %s | %.0f%% | %s | %s (%d) | %s | %.2f | %.1f / %.1f |\n",
            s.label().c_str(), percent, part_cell(trace["forward"]).c_str(),
            part_cell(trace["recompute"]).c_str(), trace["recompute"]["operations"].get<int>(),
            part_cell(trace["backward"]).c_str(), trace["between_ms"].get<double>(),
            trace["predicted_ms"].get<double>(), trace["measured_ms"].get<double>());
        trace_md << text;
      }
      rows.push_back(row);
    }
  }
  md << "\nPlain training through the same stages (no schedule): its measured step against the "
        "predicted store-all makespan.\n\n"
     << "| model | predicted ms | measured ms | measured / predicted | measured peak |\n"
     << "|---|---:|---:|---:|---:|\n"
     << plain_md.str();
  if (!allocator_md.str().empty())
    md << "\nThe caching allocator's view of each step: the measured peak (its blocks, above the "
          "start of the step, plus the batch), the same for the tensors' exact sizes, and the "
          "largest its live blocks and its reserved segments reached in all (parameters, "
          "gradients and cache included).\n\n"
       << "| model | budget | measured peak (blocks) | exact sizes | all blocks | reserved |\n"
       << "|---|---:|---:|---:|---:|---:|\n"
       << allocator_md.str();
  if (!trace_md.str().empty())
    md << "\nWhere the time goes: " << traced << " more steps of each schedule, traced, the median one "
          "shown (each operation timed "
          "where it runs; on a GPU, between CUDA events), predicted / measured ms: the forwards "
          "before the loss, the recomputations (forwards after it, how many), the backwards, "
          "the time between operations (the runtime's own work), and the step without the "
          "caller's loss.\n\n"
       << "| model | budget | forwards | recomputations | backwards | between | step |\n"
       << "|---|---:|---:|---:|---:|---:|---:|\n"
       << trace_md.str();
  write_file(markdown_path, md.str());
  write_file(json_path, json{{"device", device_name(device)},
                             {"libtorch", TORCH_VERSION},
                             {"rounds", std::min(rounds, steps)},
                             {"rows", rows},
                             {"plain", plain_rows}}
                                .dump(2) +
                            "\n");
  if (markdown_path.empty()) std::printf("\n%s", md.str().c_str());
  return all_within ? 0 : 1;
}

// ---- throughput ----

struct Config {
  std::string method;  // plain-libtorch, remat-optimal, remat-periodic, plain-pytorch, checkpoint_sequential
  std::string setting;  // "75%", "K=4", ""
  Measured m;
  double predicted_ms = 0;
  std::int64_t predicted_peak = 0;
  double images_per_s(int batch) const { return m.oom || m.step_ms.empty() ? 0 : 1000.0 * batch / m.median_ms(); }
};

int throughput(const std::string& model, torch::Device device, int batch, int image,
               const std::vector<double>& budgets, int steps, int warmup, int repeat,
               const std::string& pytorch_json, const std::string& json_path,
               const std::string& markdown_path, const std::string& svg_path) {
  Setup s(model, device, batch, image);
  s.profile(repeat);
  const int length = s.chain.length();
  std::vector<Config> configs;
  auto run = [&](const std::string& method, const std::string& setting,
                 const std::function<remat::Tensors(const torch::Tensor&)>& forward,
                 const remat::Solution* solution) {
    std::fprintf(stderr, "%s: %s %s\n", s.label().c_str(), method.c_str(), setting.c_str());
    Config c{method, setting, measure(s, forward, steps, warmup)};
    if (solution != nullptr) {
      c.predicted_ms = solution->makespan_ms;
      c.predicted_peak = solution->peak_bytes;
    }
    configs.push_back(c);
  };
  const std::vector<remat::NamedStage> stages = remat::stages_of(s.net);
  run(
      "plain-libtorch", "", [&](const torch::Tensor& x) { return remat::run_stages(stages, {x}); },
      nullptr);
  remat::Checkpointable chk(s.net);
  chk->set_chain(s.chain);
  const std::int64_t store_all = chk->store_all_peak();  // the runtime's reserve included
  for (double percent : budgets) {
    const auto budget =
        static_cast<std::int64_t>(std::llround(percent / 100 * static_cast<double>(store_all)));
    char setting[16];
    std::snprintf(setting, sizeof setting, "%.0f%%", percent);
    const remat::Solution solution = chk->compute_sequence(budget);
    if (!solution.ok()) {
      std::fprintf(stderr, "  %s: infeasible, needs %lld bytes\n", setting,
                   static_cast<long long>(solution.min_feasible_budget_bytes));
      continue;
    }
    run(
        "remat-optimal", setting,
        [&](const torch::Tensor& x) { return chk->forward(remat::Tensors{x}); }, &solution);
  }
  // Store-all again, with one backward engine call per stage as the runtime made them before it
  // ran consecutive backwards in one call: what that gives, in the same process.
  {
    const remat::Solution solution = chk->compute_sequence(store_all, remat::Algorithm::kStoreAll);
    const remat::detail::FuseBackwardCalls per_stage_calls(false);
    if (solution.ok())
      run(
          "remat-per-stage-backward", "100%",
          [&](const torch::Tensor& x) { return chk->forward(remat::Tensors{x}); }, &solution);
  }
  const int max_segments = std::min(length, static_cast<int>(std::floor(2 * std::sqrt(length))));
  for (int k = 2; k <= max_segments; ++k) {
    const remat::Solution solution = chk->compute_sequence(
        remat::SolveOptions(4 * store_all).algorithm(remat::Algorithm::kPeriodic).segments(k));
    run(
        "remat-periodic", "K=" + std::to_string(k),
        [&](const torch::Tensor& x) { return chk->forward(remat::Tensors{x}); }, &solution);
  }
  if (!pytorch_json.empty()) {
    std::ifstream in(pytorch_json);
    if (!in) throw std::invalid_argument("cannot read " + pytorch_json);
    const json py = json::parse(in);
    if (py.value("stages", 0) != length)
      std::fprintf(stderr, "warning: %s split the network into %d stages, remat into %d\n",
                   pytorch_json.c_str(), py.value("stages", 0), length);
    for (const json& r : py.at("results")) {
      Config c;
      c.method = r.at("method").get<std::string>();
      if (r.contains("segments") && !r.at("segments").is_null())
        c.setting = "K=" + std::to_string(r.at("segments").get<int>());
      c.m.oom = r.value("oom", false);
      if (!c.m.oom) {
        c.m.step_ms = r.at("step_ms").get<std::vector<double>>();
        c.m.peak_bytes = r.at("peak_bytes").get<std::int64_t>();
      }
      configs.push_back(c);
    }
  }

  // The tables.
  std::ostringstream md;
  const Config& plain = configs.front();
  md << "Throughput of " << s.label() << " (" << length << " stages) on " << device_name(device)
     << ", LibTorch " << TORCH_VERSION << ": median of " << steps << " steps after " << warmup
     << "; peak = activation bytes above parameters, gradients and the batch.\n\n"
     << "| method | setting | median ms | images/s | peak | vs plain LibTorch | predicted ms |\n"
     << "|---|---|---:|---:|---:|---:|---:|\n";
  for (const Config& c : configs) {
    char line[256];
    if (c.m.oom) {
      std::snprintf(line, sizeof line, "| %s | %s | out of memory | | | | |\n", c.method.c_str(), c.setting.c_str());
    } else {
      char predicted[32] = "";
      if (c.predicted_ms > 0) std::snprintf(predicted, sizeof predicted, "%.1f", c.predicted_ms);
      std::snprintf(line, sizeof line, "| %s | %s | %.1f | %.1f | %s | %.3f | %s |\n", c.method.c_str(),
                    c.setting.c_str(), c.m.median_ms(), c.images_per_s(batch),
                    mib(static_cast<double>(c.m.peak_bytes)).c_str(),
                    c.images_per_s(batch) / std::max(plain.images_per_s(batch), 1e-9), predicted);
    }
    md << line;
  }
  // At equal memory: for each remat budget, the fastest configuration of each other method
  // whose measured peak does not exceed remat's.
  md << "\nAt equal memory: for each remat budget, the fastest configuration of each method "
        "whose measured peak is at most remat's.\n\n"
     << "| remat budget | remat peak | remat images/s | best checkpoint_sequential | ratio | best remat periodic | ratio |\n"
     << "|---|---:|---:|---|---:|---|---:|\n";
  json comparisons = json::array();
  for (const Config& r : configs) {
    if (r.method != "remat-optimal" || r.m.oom) continue;
    auto best = [&](const std::string& method) -> const Config* {
      const Config* found = nullptr;
      for (const Config& c : configs)
        if (c.method == method && !c.m.oom && c.m.peak_bytes <= r.m.peak_bytes &&
            (found == nullptr || c.images_per_s(batch) > found->images_per_s(batch)))
          found = &c;
      return found;
    };
    json row = {{"budget", r.setting}, {"remat_peak_bytes", r.m.peak_bytes},
                {"remat_images_per_s", r.images_per_s(batch)}};
    md << "| " << r.setting << " | " << mib(static_cast<double>(r.m.peak_bytes)) << " | "
       << std::lround(r.images_per_s(batch));
    for (const std::string method : {"checkpoint_sequential", "remat-periodic"}) {
      const Config* b = best(method);
      if (b == nullptr) {
        md << " | none fits | ";
        row[method] = nullptr;
        continue;
      }
      const double ratio = r.images_per_s(batch) / b->images_per_s(batch);
      char cell[128];
      std::snprintf(cell, sizeof cell, " | %s (%s, %.0f/s) | %.3f", b->setting.c_str(),
                    mib(static_cast<double>(b->m.peak_bytes)).c_str(), b->images_per_s(batch), ratio);
      md << cell;
      row[method] = {{"setting", b->setting}, {"peak_bytes", b->m.peak_bytes},
                     {"images_per_s", b->images_per_s(batch)}, {"ratio", ratio}};
    }
    md << " |\n";
    comparisons.push_back(row);
  }

  json results = json::array();
  for (const Config& c : configs)
    results.push_back({{"method", c.method}, {"setting", c.setting}, {"oom", c.m.oom},
                       {"step_ms", c.m.step_ms}, {"median_ms", c.m.median_ms()},
                       {"peak_bytes", c.m.peak_bytes}, {"images_per_s", c.images_per_s(batch)},
                       {"predicted_ms", c.predicted_ms}, {"predicted_peak_bytes", c.predicted_peak}});
  write_file(json_path, json{{"model", s.label()}, {"stages", length}, {"device", device_name(device)},
                             {"libtorch", TORCH_VERSION}, {"steps", steps}, {"results", results},
                             {"at_equal_memory", comparisons}}
                            .dump(2) + "\n");
  write_file(markdown_path, md.str());
  std::printf("%s\n", md.str().c_str());

  remat::MeasurementPlot plot(s.label() + ": throughput against peak activation memory", "images per second");
  for (const auto& [method, name, connect] :
       std::vector<std::tuple<std::string, std::string, bool>>{
           {"remat-optimal", "remat optimal (budgets)", true},
           {"remat-periodic", "remat periodic (K segments)", false},
           {"checkpoint_sequential", "PyTorch checkpoint_sequential (K segments)", false},
           {"plain-libtorch", "plain LibTorch", false},
           {"plain-pytorch", "plain PyTorch", false}}) {
    remat::MeasurementSeries series{name, {}, connect};
    for (const Config& c : configs)
      if (c.method == method && !c.m.oom)
        series.points.push_back({static_cast<double>(c.m.peak_bytes), c.images_per_s(batch), c.setting});
    if (!series.points.empty()) plot.series.push_back(series);
  }
  write_file(svg_path, remat::measurement_svg(plot));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"remat_training_bench: fidelity and throughput of training under remat's schedules"};
  app.require_subcommand(1);
  std::string device_text = "cpu", json_path, markdown_path, svg_path, pytorch_json, models_text = "resnet18",
              budgets_text = "100,75,50,30", timing_text = "auto";
  int batch = 32, image = 0, steps = 20, warmup = 3, repeat = 5, threads = 0, traced = 5, rounds = 1;
  bool malloc_defaults = false;
  for (CLI::App* cmd : {app.add_subcommand("fidelity", "Peak and step time against the prediction"),
                        app.add_subcommand("throughput", "Throughput against checkpoint_sequential")}) {
    cmd->add_option("--device", device_text, "cpu, cuda or cuda:N")->capture_default_str();
    cmd->add_option("--batch", batch)->capture_default_str();
    cmd->add_option("--image", image, "Input height and width (default: the model's)");
    cmd->add_option("--budgets", budgets_text, "Percentages of the store-all peak")->capture_default_str();
    cmd->add_option("--steps", steps, "Timed steps (median)")->capture_default_str();
    cmd->add_option("--warmup", warmup, "Untimed steps first")->capture_default_str();
    cmd->add_option("--repeat", repeat, "Profiler repetitions")->capture_default_str();
    cmd->add_option("--threads", threads, "CPU threads for LibTorch");
    cmd->add_option("--json", json_path, "Write the results as JSON");
    cmd->add_option("--markdown", markdown_path, "Write the tables as Markdown");
    cmd->add_flag("--malloc-defaults", malloc_defaults, "Leave glibc's malloc settings");
    cmd->add_option("--chains", chains_dir,
                    "Save each profiled chain as JSON into this folder "
                    "(SUBCOMMAND-MODEL-bBATCH-IMAGE-TIMING.json)");
    cmd->add_option("--timing", timing_text,
                    "How the profiles take times: auto, stages or passes (remat profile --timing)")
        ->capture_default_str();
  }
  app.get_subcommand("fidelity")->add_option("--models", models_text, "Comma-separated")->capture_default_str();
  app.get_subcommand("fidelity")
      ->add_option("--traced", traced, "Traced steps after the timed ones (the table: their median)")
      ->capture_default_str();
  app.get_subcommand("fidelity")
      ->add_option("--rounds", rounds,
                   "Rounds in which plain training and the schedules take turns (the timed steps "
                   "split among them)")
      ->capture_default_str();
  CLI::App* tp = app.get_subcommand("throughput");
  tp->add_option("--model", models_text)->required();
  tp->add_option("--pytorch-json", pytorch_json, "Results of bench/pytorch_baseline.py to merge");
  tp->add_option("--svg", svg_path, "Draw throughput against peak memory");
  CLI11_PARSE(app, argc, argv);
  try {
    if (steps < 1 || warmup < 0 || batch < 1 || repeat < 1 || traced < 0 || rounds < 1)
      throw std::invalid_argument(
          "--steps, --batch, --repeat and --rounds must be at least 1, --warmup and --traced at "
          "least 0");
    profile_timing = remat::parse_timing(timing_text);
    chains_prefix = app.got_subcommand("fidelity") ? "fidelity" : "throughput";
    const torch::Device device(device_text);
    if (device.is_cuda()) remat::exact_cuda_blocks();  // plain training measured alike
    if (threads > 0) torch::set_num_threads(threads);
    if (!malloc_defaults) remat::keep_freed_memory();
    std::vector<double> budgets;
    for (const std::string& b : split(budgets_text)) budgets.push_back(std::stod(b));
    if (app.got_subcommand("fidelity"))
      return fidelity(split(models_text), device, batch, image, budgets, steps, warmup, rounds,
                      repeat, traced, json_path, markdown_path);
    return throughput(models_text, device, batch, image, budgets, steps, warmup, repeat,
                      pytorch_json, json_path, markdown_path, svg_path);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "remat_training_bench: %s\n", error.what());
    return 2;
  }
}
