// remat train: real training steps (SGD on random data) with a schedule, printing per-step
// time, peak activation memory and loss, against the schedule's prediction.
#include <c10/util/Logging.h>
#include <fmt/format.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "remat/distributed.h"
#include "remat/runtime.h"
#include "torch_common.h"

namespace remat::cli {
namespace {

struct TrainArgs {
  std::string model;
  int batch = 0;
  std::string image;
  std::string budget;
  int steps = 10;
  std::string algorithm = "optimal";
  int segments = 0;
  std::string device = "cpu";
  std::string chain_file;
  int classes = 1000;
  bool classes_given = false;
  int sequence = kSequenceNotGiven;
  std::string granularity;
  std::string tokens_file;
  double lr = 0.01;
  int threads = 0;
  int repeat = 3;
  // Data-parallel training.
  int nproc = 0;
  int rank = -1;
  std::string master;
  std::string backend = "auto";
  double timeout_s = 300;
  std::string trace_file;
};

/// Training sequences from a file of token ids: little-endian uint16 values one after the other,
/// the format of nanoGPT's train.bin (GPT-2's 50,257 ids fit). Each batch takes windows at
/// random offsets (torch's generator: a seeded run repeats); every id read is checked against
/// the vocabulary.
class TokenFile {
 public:
  TokenFile(std::string path, int sequence, int vocab)
      : path_(std::move(path)), sequence_(sequence), vocab_(vocab) {
    std::error_code error;
    if (!std::filesystem::is_regular_file(path_, error))
      throw std::invalid_argument(fmt::format(
          "--tokens {}: {}", printable(path_),
          std::filesystem::exists(path_, error) ? "not a regular file" : "no such file"));
    file_.open(path_, std::ios::binary);
    if (!file_)
      throw std::invalid_argument(
          fmt::format("--tokens {}: cannot open it: {}", printable(path_), std::strerror(errno)));
    const auto bytes = static_cast<std::int64_t>(std::filesystem::file_size(path_));
    if (bytes % 2 != 0)
      throw std::invalid_argument(fmt::format(
          "--tokens {}: {} bytes is not a whole number of tokens (expected little-endian uint16 "
          "ids, 2 bytes each, as nanoGPT's train.bin)",
          printable(path_), bytes));
    tokens_ = bytes / 2;
    if (tokens_ < sequence_)
      throw std::invalid_argument(
          fmt::format("--tokens {}: {} tokens, fewer than one sequence of {}", printable(path_),
                      tokens_, sequence_));
    // A file of up to 256 MiB is checked whole now, before profiling; a larger one as it is read.
    if (bytes <= (std::int64_t{256} << 20)) {
      std::vector<unsigned char> chunk(std::size_t{1} << 20);
      for (std::int64_t at = 0; at < bytes;) {
        const std::int64_t n =
            std::min<std::int64_t>(static_cast<std::int64_t>(chunk.size()), bytes - at);
        file_.read(reinterpret_cast<char*>(chunk.data()), static_cast<std::streamsize>(n));
        if (!file_) throw read_error(n, at);
        check(chunk.data(), n / 2, at / 2);
        at += n;
      }
    }
  }

  /// `batch` sequences, (batch, sequence) int64.
  torch::Tensor next(int batch) {
    torch::Tensor ids = torch::empty({batch, sequence_}, torch::kLong);
    std::vector<unsigned char> bytes(2 * static_cast<std::size_t>(sequence_));
    for (int b = 0; b < batch; ++b) {
      const std::int64_t offset = torch::randint(tokens_ - sequence_ + 1, {1}).item<std::int64_t>();
      file_.seekg(2 * offset);
      file_.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
      if (!file_) throw read_error(static_cast<std::int64_t>(bytes.size()), 2 * offset);
      check(bytes.data(), sequence_, offset);
      std::int64_t* row = ids.data_ptr<std::int64_t>() + static_cast<std::int64_t>(b) * sequence_;
      for (int t = 0; t < sequence_; ++t) row[t] = bytes[2 * t] | (bytes[2 * t + 1] << 8);
    }
    return ids;
  }

 private:
  // Every id of `count` tokens read at token `first` is in the vocabulary.
  void check(const unsigned char* bytes, std::int64_t count, std::int64_t first) const {
    for (std::int64_t t = 0; t < count; ++t) {
      const int id = bytes[2 * t] | (bytes[2 * t + 1] << 8);
      if (id >= vocab_)
        throw std::invalid_argument(
            fmt::format("--tokens {}: token {} at byte {} is not below the vocabulary's size {}",
                        printable(path_), id, 2 * (first + t), vocab_));
    }
  }
  std::runtime_error read_error(std::int64_t count, std::int64_t at) const {
    return std::runtime_error(
        fmt::format("--tokens {}: cannot read {} bytes at byte {}", printable(path_), count, at));
  }

  std::string path_;
  int sequence_, vocab_;
  std::ifstream file_;
  std::int64_t tokens_ = 0;
};

// "HOST:PORT", "HOST" (port 29500), "[IPV6]:PORT" or "[IPV6]". An IPv6 address without
// brackets is refused: in "fe80::1:29500" nothing tells the port from the address.
std::pair<std::string, int> parse_master(const std::string& text) {
  std::string host = text, port_text;
  bool has_port = false;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string::npos || (close + 1 < text.size() && text[close + 1] != ':'))
      throw std::invalid_argument(
          fmt::format("--master {}: expected [IPV6] or [IPV6]:PORT", printable(text)));
    host = text.substr(1, close - 1);
    has_port = close + 1 < text.size();
    if (has_port) port_text = text.substr(close + 2);
  } else if (const std::size_t colon = text.find(':'); colon != std::string::npos) {
    if (text.find(':', colon + 1) != std::string::npos)
      throw std::invalid_argument(
          fmt::format("--master {}: an IPv6 address goes in brackets, as [{}] or [ADDRESS]:PORT",
                      printable(text), printable(text)));
    host = text.substr(0, colon);
    has_port = true;
    port_text = text.substr(colon + 1);
  }
  int port = 29500;
  if (has_port) {
    const std::optional<long> value = whole_number(port_text, 1, 65535);
    if (!value)
      throw std::invalid_argument(
          fmt::format("--master {}: the port must be a number from 1 to 65535", printable(text)));
    port = static_cast<int>(*value);
  }
  if (host.empty())
    throw std::invalid_argument(fmt::format("--master {}: no host (HOST:PORT)", printable(text)));
  return {host, port};
}

// remat train --nproc N without a rank: N local ranks, each this same command with torchrun's
// variables. Returns what the job's exit code should be.
int launch_ranks(const TrainArgs& args) {
  std::pair<std::string, int> master{"127.0.0.1", 0};
  if (!args.master.empty()) master = parse_master(args.master);
  if (master.second == 0) master.second = distributed::free_local_port();
  std::vector<std::string> argv = command_line();
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) argv[0] = self.string();
  fmt::print(stderr, "remat: starting {} ranks here, rendezvous at {}\n", args.nproc,
             distributed::host_port(master.first, master.second));
  const auto grace = std::chrono::milliseconds(static_cast<std::int64_t>(args.timeout_s * 1000)) +
                     std::chrono::seconds(30);
  const std::vector<distributed::RankExit> exits = distributed::launch_local(
      argv, args.nproc,
      distributed::LaunchOptions().master(master.first, master.second).grace(grace));
  // The job's code: the first rank's own error code (not a signal); a job whose ranks were only
  // killed is a distributed failure.
  int code = kExitOk;
  for (const auto& e : exits) {
    if (e.code == 0) continue;
    if (e.killed_by_launcher)
      fmt::print(stderr, "remat: rank {} had not stopped {:.0f} s after another failed: killed\n",
                 e.rank, std::chrono::duration<double>(grace).count());
    else if (e.code > 128)
      fmt::print(stderr, "remat: rank {} was killed by signal {}\n", e.rank, e.code - 128);
    else
      fmt::print(stderr, "remat: rank {} exited with code {}\n", e.rank, e.code);
    if (code == kExitOk || (code == kExitDistributed && e.code < 128 && e.code != kExitDistributed))
      code = e.code > 128 ? kExitDistributed : e.code;
  }
  return code;
}

// A traced step as Chrome's trace event format (chrome://tracing, Perfetto): one complete
// event ("ph": "X") per entry of the trace on the "measured" row, and per operation of the
// sequence at its predicted time on the "predicted" row, in microseconds.
std::string chrome_trace(const std::vector<TracedOperation>& trace, const Solution& solution,
                         const std::string& title) {
  const Sequence& sequence = solution.sequence;
  const std::vector<std::string> names = op_strings(sequence);
  const std::vector<TracedOperation::Kind> kinds = operation_kinds(sequence);
  nlohmann::json events = nlohmann::json::array();
  for (const auto& [tid, name] : {std::pair<int, const char*>{0, "measured"}, {1, "predicted"}})
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", tid},
                      {"args", {{"name", name}}}});
  for (const TracedOperation& op : trace)
    events.push_back({{"name", op.label},
                      {"cat", traced_kind_name(op.kind)},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", 0},
                      {"ts", op.start_ms * 1000},
                      {"dur", op.measured_ms * 1000},
                      {"args", {{"predicted_ms", op.predicted_ms}, {"measured_ms", op.measured_ms}}}});
  const std::vector<OpRecord>& predicted = solution.simulation.trace;
  for (std::size_t k = 0; k < predicted.size() && k < sequence.size(); ++k) {
    const double ms = predicted[k].end_ms - predicted[k].start_ms;
    events.push_back({{"name", names[k]},
                      {"cat", traced_kind_name(kinds[k])},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", 1},
                      {"ts", predicted[k].start_ms * 1000},
                      {"dur", ms * 1000},
                      {"args", {{"predicted_ms", ms}}}});
  }
  return nlohmann::json{{"traceEvents", events},
                        {"displayTimeUnit", "ms"},
                        {"otherData", {{"title", title}, {"schedule", collapsed_string(sequence)}}}}
             .dump(1) +
         "\n";
}

// What every rank of a job must be given alike, one setting a line (a mismatch names its line):
// another learning rate or step count would train another model, or leave a rank waiting. Not
// compared: what a rank may have of its own (its GPU's number, its token file's path, its
// threads, the timeout), and what rank 0 alone uses (--chain, --repeat).
std::string training_settings(const TrainArgs& args, Algorithm algorithm, const ModelInput& in,
                              const std::unique_ptr<TokenFile>& token_file) {
  return fmt::format(
      "--model {}\n--batch {}\ninput {}\n--classes {}\n--steps {}\n--lr {}\n--budget {}\n"
      "--algorithm {}\n--segments {}\n--device {}\ndata {}\n",
      in.info->name, args.batch, in.label(args.batch), args.classes, args.steps, args.lr,
      args.budget, algorithm_name(algorithm), args.segments,
      c10::DeviceTypeName(in.device.type(), /*lower_case=*/true),
      token_file ? "a token file" : "random");
}

// The steps of train(), once the job (if any) has started.
int train_steps(const TrainArgs& args, Algorithm algorithm,
                const std::optional<distributed::Environment>& env, const ModelInput& in,
                const std::shared_ptr<distributed::Group>& group, distributed::BackendKind backend,
                const std::unique_ptr<TokenFile>& token_file) {
  const bool speak = !env || env->rank == 0;  // rank 0 prints for the job
  if (group)
    group->check_same("the training configuration",
                      training_settings(args, algorithm, in, token_file));
  const InjectedFault fault = InjectedFault::from_env();
  torch::manual_seed(0);
  torch::nn::Sequential net = build_model(in, args.classes);
  net->to(in.device);
  net->train();
  // Gradients exist before the first step, as after any step: they are not activations.
  for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
  // Each rank trains on its own data (rank 0 on what a single process would).
  if (env && env->rank > 0) torch::manual_seed(static_cast<std::uint64_t>(1000003) * env->rank);
  const torch::Tensor sample = random_input(in, args.batch);
  const torch::Tensor target = random_target(in, args.batch, args.classes);

  // The chain: measured now, or a file measured earlier; in a data-parallel job, by rank 0 alone
  // (its timings decide the schedule of every rank) and sent to the others.
  Chain chain;
  std::string chain_json;
  if (speak) {
    if (args.chain_file.empty()) {
      ProgressBar bar("profile " + in.info->name);
      try {
        chain = profile(net, sample,
                        with_progress(ProfileOptions()
                                          .repeat(args.repeat)
                                          .name(in.label(args.batch))
                                          .loss(training_loss_of(in, target))
                                          // the step below lets the output go with the loss
                                          .output_held(false),
                                      bar))
                    .chain;
      } catch (const ProfileError& error) {
        if (group) group->report_failure(error.what_without_backtrace());
        throw std::invalid_argument(in.info->name + ": " + error.what_without_backtrace());
      }
      bar.finish(chain.length());
    } else {
      chain = load_chain(args.chain_file);
      check_chain_model(chain, in, args.chain_file);
    }
    if (group) chain_json = chain_to_json(chain);
  }
  if (group) {
    chain_json = group->broadcast("the chain", chain_json);
    if (!speak) chain = parse_chain(chain_json, "the chain from rank 0");
  }
  Checkpointable chk(net);
  chk->set_chain(chain);  // refuses a chain of another length
  // A chain measured at another batch, image size or dtype has other sizes throughout: its
  // schedule would not fit the budget.
  const std::int64_t input_bytes =
      counted_bytes(in.device, static_cast<std::int64_t>(sample.nbytes()));
  if (chain.input_bytes() != input_bytes)
    throw std::invalid_argument(
        fmt::format("--chain {}: the chain's input is {} bytes, but {} takes {} ({} bytes): it was "
                    "profiled for another batch, image size or device; profile this one "
                    "(remat profile --model {} --batch {} ...)",
                    args.chain_file, chain.input_bytes(), in.label(args.batch),
                    shape_string(sample.sizes().vec()), input_bytes, in.info->name, args.batch));

  // The schedule. Percentages are of the store-all peak as the runtime needs it; a budget is
  // per rank.
  SolveOptions solve_options(0);
  solve_options.algorithm(algorithm);
  if (args.segments > 0) solve_options.segments(args.segments);
  const std::int64_t budget = parse_budget(args.budget, chk->store_all_peak(),
                                           [&] { return chk->min_budget(solve_options); });
  solve_options.budget_bytes(budget);
  const Solution& s = group ? distributed::solve(*chk, *group, solve_options)
                            : chk->compute_sequence(solve_options);
  if (!s.ok()) {
    if (speak)
      fmt::print(stderr,
                 "remat: infeasible: {} cannot train {} in {}; it needs at least {} ({} bytes)\n",
                 args.algorithm, in.label(args.batch), format_bytes(budget),
                 format_bytes(s.min_feasible_budget_bytes), s.min_feasible_budget_bytes);
    return kExitInfeasible;
  }
  std::unique_ptr<distributed::DataParallel> dp;
  if (group) dp = std::make_unique<distributed::DataParallel>(chk.ptr(), group);
  if (speak) {
    fmt::print("model      {} ({})\n", in.label(args.batch), counted(chain.length(), "stage"));
    if (group)
      fmt::print(
          "ranks      {} ({} backend), each with this batch and budget; {} gradient bucket(s)\n",
          group->size(), distributed::backend_name(backend), dp->bucket_bytes().size());
    fmt::print("schedule   {} for {}: {}\n", args.algorithm, format_bytes(budget),
               collapsed_string(s.sequence));
    fmt::print(
        "predicted  peak {}, {:.1f} ms per step ({} against store-all, whose peak is {})\n\n",
        format_bytes(s.peak_bytes), s.makespan_ms,
        signed_percent(100 * (s.makespan_ms / s.store_all_makespan_ms - 1)),
        format_bytes(chk->store_all_peak()));
    std::fflush(stdout);
  }

  // The steps.
  MemoryTracker& tracker = MemoryTracker::for_device(in.device);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(args.lr).momentum(0.9));
  if (speak) {
    if (dp)
      fmt::print("{:>6} {:>12} {:>14} {:>12} {:>14} {:>8}\n", "step", "time", "peak", "loss",
                 "all-reduce", "hidden");
    else
      fmt::print("{:>6} {:>12} {:>14} {:>12}\n", "step", "time", "peak", "loss");
  }
  std::vector<double> times, all_reduce, hidden;
  std::int64_t worst_peak = 0;
  ProgressBar bar("train " + in.info->name, speak);
  for (int step = 0; step < args.steps; ++step) {
    bar.update(step, args.steps, "step " + std::to_string(step + 1));
    for (auto& p : net->parameters()) p.mutable_grad().zero_();
    torch::Tensor x;
    try {
      x = token_file ? token_file->next(args.batch).to(in.device) : random_input(in, args.batch);
    } catch (const std::exception&) {
      bar.clear();  // the message on a line of its own
      throw;
    }
    double loss_value = 0;
    if (speak && !args.trace_file.empty() && step + 1 == args.steps) chk->trace_next_step();
    synchronize(in.device);  // the previous step's work is not this step's time
    const PeakScope scope(tracker);
    const auto start = std::chrono::steady_clock::now();
    try {
      torch::Tensor loss = training_loss(in, chk->forward(Tensors{x}), target);
      const torch::Tensor held = fault.at_step(step + 1, in.device);
      if (env) fault.store_thread_at_step(step + 1, env->rank);
      if (dp)
        dp->backward(loss);
      else
        loss.backward();
      synchronize(in.device);
      loss_value = loss.item<double>();
    } catch (const c10::OutOfMemoryError& error) {
      bar.clear();
      if (group) group->report_failure(fmt::format("out of memory at step {}", step + 1));
      print_step_out_of_memory(env ? fmt::format("rank {}: ", env->rank) : "", in.device, step + 1,
                               error, s.peak_bytes);
      return kExitOutOfMemory;
    } catch (const distributed::DistributedError&) {
      bar.clear();
      throw;
    } catch (const c10::Error& error) {
      throw std::runtime_error(
          fmt::format("step {}: {}", step + 1, error.what_without_backtrace()));
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const std::int64_t peak = scope.peak_above_start();
    sgd.step();
    times.push_back(ms);
    worst_peak = std::max(worst_peak, peak);
    bar.clear();
    if (dp) {
      const distributed::StepTimes& t = dp->last_step();
      // Not measured on a GPU (NaN: distributed/data_parallel.h), where "exposed" is shown.
      const bool known = !std::isnan(t.all_reduce_ms);
      all_reduce.push_back(known ? t.all_reduce_ms : t.exposed_ms);
      if (known) hidden.push_back(t.all_reduce_ms > 0 ? 100 * t.hidden_ms / t.all_reduce_ms : 100);
      if (speak && known)
        fmt::print("{:>6} {:>9.1f} ms {:>14} {:>12.5f} {:>11.1f} ms {:>7.0f}%\n", step + 1, ms,
                   format_bytes(peak), loss_value, t.all_reduce_ms, hidden.back());
      else if (speak)
        fmt::print("{:>6} {:>9.1f} ms {:>14} {:>12.5f} {:>11.1f} ms exposed\n", step + 1, ms,
                   format_bytes(peak), loss_value, t.exposed_ms);
    } else if (speak) {
      fmt::print("{:>6} {:>9.1f} ms {:>14} {:>12.5f}\n", step + 1, ms, format_bytes(peak),
                 loss_value);
    }
    std::fflush(stdout);
  }
  bar.finish(args.steps, "steps");
  if (speak) {
    fmt::print("\n{:<12} {:>14} {:>16}\n", "", "peak", "step time");
    fmt::print("{:<12} {:>14} {:>13.1f} ms  (median of {}{})\n", "measured",
               format_bytes(worst_peak), median(times), times.size(), group ? ", rank 0" : "");
    fmt::print("{:<12} {:>14} {:>13.1f} ms\n", "predicted", format_bytes(s.peak_bytes),
               s.makespan_ms);
    fmt::print("{:<12} {:>14}\n", "budget", format_bytes(budget));
    if (!args.trace_file.empty()) {
      const TraceSummary t = summarize_trace(chk->last_trace());
      write_text_file(args.trace_file,
                      chrome_trace(chk->last_trace(), s, in.label(args.batch) + ", " +
                                                             args.algorithm + " for " +
                                                             format_bytes(budget)),
                      "the trace");
      fmt::print(
          "traced       step {} into {}, measured (predicted) ms: forwards {:.1f} ({:.1f}), {} "
          "recomputation(s) {:.1f} ({:.1f}), backwards {:.1f} ({:.1f}), between operations "
          "{:.2f}\n",
          args.steps, args.trace_file, t.forward.measured_ms, t.forward.predicted_ms,
          t.recompute.operations, t.recompute.measured_ms, t.recompute.predicted_ms,
          t.backward.measured_ms, t.backward.predicted_ms, t.between_ms);
    }
    if (dp && hidden.empty())
      fmt::print(
          "all-reduce   {:.1f} ms per step (median) after the backward's end; on a GPU its own "
          "time and the part the backward hid are not measured\n",
          median(all_reduce));
    else if (dp)
      fmt::print("all-reduce   {:.1f} ms per step (median), {:.0f}% of it hidden by the backward\n",
                 median(all_reduce), median(hidden));
  }
  if (worst_peak > budget) {
    const std::string who = env ? fmt::format("rank {}: ", env->rank) : "";
    // The others stop at their barrier, naming this rank, rather than wait out the timeout.
    if (group)
      group->report_failure(fmt::format("its measured peak {} exceeded the budget {}",
                                        format_bytes(worst_peak), format_bytes(budget)));
    if (!args.chain_file.empty()) {
      // The schedule is only as good as the sizes it was computed from.
      fmt::print(stderr,
                 "remat: {}the measured peak {} exceeded the budget {}: the chain {} understates "
                 "what {} needs here (profiled with another LibTorch, device or model, or "
                 "edited); profile it again (remat profile --model {} --batch {} ...)\n",
                 who, format_bytes(worst_peak), format_bytes(budget), printable(args.chain_file),
                 in.label(args.batch), in.info->name, args.batch);
      return kExitBadInput;
    }
    print_peak_over_budget(who, worst_peak, budget);
    return kExitInternal;
  }
  if (group) group->barrier();  // rank 0 hosts the rendezvous: it stays until all are done
  return kExitOk;
}

// c10d's own log lines (each retry while rank 0 starts; a lost connection, with LibTorch's
// C++ backtrace) would bury the one line that names the rank that failed: a rank of the CLI
// keeps them to itself unless TORCH_CPP_LOG_LEVEL (or, for a LibTorch that logs through glog,
// as Debian's 1.13, GLOG_minloglevel) asks for them.
void quiet_c10d_log() {
  if (std::getenv("TORCH_CPP_LOG_LEVEL") != nullptr) return;
#ifdef C10_USE_GLOG
  if (std::getenv("GLOG_minloglevel") == nullptr)
    FLAGS_minloglevel = std::max(FLAGS_minloglevel, google::GLOG_FATAL);
#else
  FLAGS_caffe2_log_level = std::max(FLAGS_caffe2_log_level, 3);  // fatal only
#endif
}

// What train's options say, each checked before any work: a launcher checks them before it
// starts its ranks, so that a bad option is one error, not one per rank.
struct TrainSetup {
  Algorithm algorithm;
  ModelInput in;
  distributed::BackendKind backend;
  std::unique_ptr<TokenFile> token_file;
};

TrainSetup prepare(const TrainArgs& args) {
  const Algorithm algorithm = parse_algorithm(args.algorithm);
  ModelInput in =
      resolve_model_input(args.model, args.image, args.device, args.sequence, args.granularity);
  check_classes_option(in, args.classes_given);
  check_budget_syntax(args.budget);  // a percentage's bytes, and min's, come with the chain
  const distributed::BackendKind backend =
      distributed::resolve_backend(distributed::parse_backend(args.backend), in.device);
  if (args.nproc > 1) distributed::check_backend(backend, in.device);
  std::unique_ptr<TokenFile> token_file;
  if (!args.tokens_file.empty()) {
    if (!in.tokens())
      throw std::invalid_argument("--tokens: " + in.info->name +
                                  " takes images; --tokens is for the language models (gpt2*)");
    token_file = std::make_unique<TokenFile>(args.tokens_file, in.sequence, in.info->vocab_size);
  }
  return {algorithm, std::move(in), backend, std::move(token_file)};
}

int train(const TrainArgs& args_in, const std::optional<distributed::Environment>& env) {
  TrainArgs args = args_in;
  std::shared_ptr<distributed::Group> group;
  if (env) {
    // A rank's GPU is its local rank's.
    if (args.device == "cuda") args.device = "cuda:" + std::to_string(env->local_rank);
  }
  auto [algorithm, in, backend, token_file] = prepare(args);
  if (args.threads > 0) torch::set_num_threads(args.threads);
  if (env) {
    quiet_c10d_log();
    const auto timeout =
        std::chrono::milliseconds(static_cast<std::int64_t>(args.timeout_s * 1000));
    group = distributed::Group::create(
        *env, in.device, distributed::GroupOptions()
                              .backend(backend)
                              .timeout(timeout)
                              // An error escaping LibTorch 1.13's store thread: rank 0 lost.
                              .store_thread_exit_code(kExitDistributed));
  }

  try {
    return train_steps(args, algorithm, env, in, group, backend, token_file);
  } catch (const distributed::DistributedError&) {
    throw;
  } catch (const std::exception& error) {
    // The others name this rank and quote its error, rather than time out.
    if (group) group->report_failure(message_of(error));
    throw;
  }
}

}  // namespace

Action add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = add_torch_subcommand(app, "train");
  cmd->add_option("--model", args->model, "Built-in model (see `remat models`)")->required();
  cmd->add_option("--batch", args->batch, "Batch size (per rank)")->required();
  cmd->add_option("--image", args->image, "Input height, or HxW (default: the model's)");
  cmd->add_option(
         "--budget", args->budget,
         "Activation memory (per rank): SIZE (700MiB, 2.5GiB), a % of the store-all peak, min "
         "(the least any schedule fits), or either followed by + (50%+: at least the least)")
      ->required();
  cmd->add_option("--steps", args->steps, "Training steps")->capture_default_str();
  cmd->add_option("--algorithm", args->algorithm,
                  "optimal, store-all, recompute-all, periodic or revolve")
      ->capture_default_str();
  cmd->add_option("--segments", args->segments, "Segments for periodic (default: sqrt(L))");
  cmd->add_option("--device", args->device, "cpu or cuda (cuda:N)")->capture_default_str();
  cmd->add_option("--chain", args->chain_file,
                  "Use this chain file (from `remat profile` of the same model, batch, image and "
                  "device) instead of profiling");
  cmd->add_option("--classes", args->classes, "Number of classes")->capture_default_str();
  cmd->add_option("--seq", args->sequence,
                  "Sequence length of a language model (default: its longest)");
  cmd->add_option(
      "--granularity", args->granularity,
      "Transformers: block (one stage per block, the default) or half (attention; MLP)");
  cmd->add_option("--tokens", args->tokens_file,
                  "Language models: train on this file of token ids (little-endian uint16, as "
                  "nanoGPT's train.bin) instead of random ones");
  cmd->add_option("--lr", args->lr, "SGD learning rate")->capture_default_str();
  cmd->add_option("--repeat", args->repeat, "Profiler repetitions per quantity")->capture_default_str();
  cmd->add_option("--threads", args->threads, "CPU threads for LibTorch (default: its own)");
  cmd->add_option("--nproc", args->nproc,
                  "Data-parallel: the job's number of ranks; without --rank, started here as "
                  "local processes");
  cmd->add_option("--rank", args->rank,
                  "Data-parallel across machines: this process's rank, of --nproc, meeting the "
                  "others at --master");
  cmd->add_option("--master", args->master,
                  "Data-parallel: HOST:PORT of rank 0's rendezvous (default: 127.0.0.1 and a free "
                  "port for local ranks, port 29500 with --rank)");
  cmd->add_option("--backend", args->backend,
                  "Data-parallel: auto (gloo on the CPU, nccl on CUDA), gloo or nccl")
      ->capture_default_str();
  cmd->add_option("--timeout", args->timeout_s,
                  "Data-parallel: seconds a rank waits for the others before it stops, naming "
                  "the rank that failed")
      ->capture_default_str();
  cmd->add_option("--trace", args->trace_file,
                  "Time each operation of the last step, measured against predicted, into FILE "
                  "(Chrome's trace format: chrome://tracing, Perfetto; rank 0's in a job)");
  return [args, cmd]() -> int {
    args->classes_given = cmd->count("--classes") > 0;
    if (!args->trace_file.empty()) check_output_path(args->trace_file, "the trace");
    REMAT_CHECK(args->batch >= 1, "--batch must be at least 1");
    // An option that would change nothing is refused rather than ignored.
    check_segments_option(*cmd, parse_algorithm(args->algorithm), args->segments);
    REMAT_CHECK(cmd->count("--repeat") == 0 || args->chain_file.empty(),
                "--repeat applies to profiling, which --chain replaces");
    REMAT_CHECK(args->steps >= 1, "--steps must be at least 1");
    REMAT_CHECK(args->classes >= 1, "--classes must be at least 1");
    REMAT_CHECK(args->repeat >= 1 && args->repeat <= kMaxProfileRepeat,
                "--repeat must be from 1 to ", kMaxProfileRepeat);
    // SGD works in the parameters' float32: a larger rate overflows there.
    REMAT_CHECK(args->lr > 0 && args->lr <= std::numeric_limits<float>::max(), "--lr (", args->lr,
                ") must be positive and at most ", std::numeric_limits<float>::max(),
                " (float32's largest)");
    check_torch_threads(args->threads);
    REMAT_CHECK(cmd->count("--rank") == 0 || args->rank >= 0, "--rank (", args->rank,
                ") must be at least 0");
    REMAT_CHECK(cmd->count("--nproc") == 0 || args->nproc >= 1, "--nproc (", args->nproc,
                ") must be at least 1");
    REMAT_CHECK(args->nproc <= distributed::kMaxRanks, "--nproc (", args->nproc,
                ") must be at most ", distributed::kMaxRanks);
    REMAT_CHECK(args->timeout_s >= 0.2 && args->timeout_s <= 1e6,
                "--timeout must be a number of seconds from 0.2 to 1e6 (ranks beat every 50 ms "
                "at least)");
    distributed::parse_backend(args->backend);  // a bad name before any work
    // Which part of a job this process is: torchrun's variables, --rank, or the launcher.
    std::optional<distributed::Environment> env;
    if (distributed::Environment::in_env()) {
      env = distributed::Environment::from_env();
      REMAT_CHECK(args->nproc == 0 || args->nproc == env->world_size, "--nproc ", args->nproc,
                  " differs from WORLD_SIZE=", env->world_size,
                  " (set by torchrun or the launcher)");
      REMAT_CHECK(args->rank < 0, "--rank: RANK is set already (by torchrun or the launcher)");
    } else if (args->rank >= 0) {
      REMAT_CHECK(args->nproc >= 1, "--rank needs --nproc, the job's number of ranks");
      REMAT_CHECK(args->rank < args->nproc, "--rank ", args->rank, " is not below --nproc ",
                  args->nproc);
      env = distributed::Environment();
      env->rank = args->rank;
      env->world_size = args->nproc;
      env->local_rank = 0;
      std::tie(env->master_addr, env->master_port) =
          args->master.empty() ? std::pair<std::string, int>{"127.0.0.1", 29500}
                               : parse_master(args->master);
      env->check("--rank/--nproc/--master");
    } else if (args->nproc > 1) {
      REMAT_CHECK(args->nproc <= distributed::kMaxLocalRanks, "--nproc ", args->nproc,
                  " would start that many ranks on this machine, more than ",
                  distributed::kMaxLocalRanks, " (on several machines, start each rank with --rank)");
      if (!args->master.empty()) parse_master(args->master);
      const TrainSetup setup = prepare(*args);
      if (!args->chain_file.empty())
        check_chain_model(load_chain(args->chain_file), setup.in, args->chain_file);
      return launch_ranks(*args);
    }
    try {
      return train(*args, env);
    } catch (const distributed::DistributedError& error) {
      fmt::print(stderr, "remat: {}\n", printable(error.what_without_backtrace()));
      return kExitDistributed;
    }
  };
}

}  // namespace remat::cli
