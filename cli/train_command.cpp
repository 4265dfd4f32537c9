// remat train: real training steps (SGD on random data) with a schedule, printing per-step
// time, peak activation memory and loss, against the schedule's prediction.
#include <c10/util/Logging.h>
#include <fmt/format.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "chrome_trace.h"
#include "cli.h"
#include "rank_launch.h"
#include "remat/distributed.h"
#include "remat/runtime.h"
#include "token_file.h"
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
  // Offloading checkpoints to host memory, over the chain's link, --link, or the device's
  // measured while profiling.
  bool offload = false;
  std::string link;
  std::string host_memory;
};

// What every rank of a job must be given alike, one setting a line (a mismatch names its line):
// another learning rate or step count would train another model, or leave a rank waiting. Not
// compared: what a rank may have of its own (its GPU's number, its token file's path, its
// threads, the timeout), and what rank 0 alone uses (--chain, --repeat).
std::string training_settings(const TrainArgs& args, Algorithm algorithm, const ModelInput& in,
                              const std::unique_ptr<TokenFile>& token_file) {
  return fmt::format(
      "--model {}\n--batch {}\ninput {}\n--classes {}\n--steps {}\n--lr {}\n--budget {}\n"
      "--algorithm {}\n--segments {}\n--offload {}\n--host-memory {}\n--device {}\ndata {}\n",
      in.info->name, args.batch, in.label(args.batch), args.classes, args.steps, args.lr,
      args.budget, algorithm_name(algorithm), args.segments, args.offload ? "on" : "off",
      args.host_memory.empty() ? "none" : args.host_memory,
      c10::DeviceTypeName(in.device.type(), /*lower_case=*/true),
      token_file ? "a token file" : "random");
}

// The chain the schedule is solved on: measured now, or a file measured earlier; in a
// data-parallel job, by rank 0 alone (its timings decide the schedule of every rank) and sent to
// the others.
Chain job_chain(const TrainArgs& args, const ModelInput& in, torch::nn::Sequential& net,
                const torch::Tensor& sample, const torch::Tensor& target,
                const std::shared_ptr<distributed::Group>& group, bool speak) {
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
                                          .output_held(false)
                                          // offloading over the device's own link
                                          .measure_link(args.offload && args.link.empty()),
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
      if (args.offload && args.link.empty() && !chain.link) chain.link = measure_link(in.device);
    }
    apply_link_options(chain, args.link, args.offload);
    if (group) chain_json = chain_to_json(chain);
  }
  if (group) {
    chain_json = group->broadcast("the chain", chain_json);
    if (!speak) chain = parse_chain(chain_json, "the chain from rank 0");
  }
  return chain;
}

// A chain measured at another batch, image size or dtype has other sizes throughout: its
// schedule would not fit the budget.
void check_chain_input(const TrainArgs& args, const ModelInput& in, const Chain& chain,
                       const torch::Tensor& sample) {
  const std::int64_t input_bytes =
      counted_bytes(in.device, static_cast<std::int64_t>(sample.nbytes()));
  if (chain.input_bytes() != input_bytes)
    throw std::invalid_argument(
        fmt::format("--chain {}: the chain's input is {} bytes, but {} takes {} ({} bytes): it was "
                    "profiled for another batch, image size or device; profile this one "
                    "(remat profile --model {} --batch {} ...)",
                    printable(args.chain_file), chain.input_bytes(), in.label(args.batch),
                    shape_string(sample.sizes().vec()), input_bytes, in.info->name, args.batch));
}

// The model, the ranks, the schedule and its prediction, then the steps' table header.
void print_plan(const TrainArgs& args, const ModelInput& in, const Chain& chain, const Solution& s,
                std::int64_t budget, std::int64_t store_all, const distributed::Group* group,
                distributed::BackendKind backend, const distributed::DataParallel* dp) {
  fmt::print("model      {} ({})\n", in.label(args.batch), counted(chain.length(), "stage"));
  if (group)
    fmt::print(
        "ranks      {} ({} backend), each with this batch and budget; {} gradient bucket(s)\n",
        group->size(), distributed::backend_name(backend), dp->bucket_bytes().size());
  fmt::print("schedule   {} for {}: {}\n", args.algorithm, format_bytes(budget),
             collapsed_string(s.sequence));
  fmt::print("predicted  peak {}, {:.1f} ms per step ({} against store-all, whose peak is {})\n",
             format_bytes(s.peak_bytes), s.makespan_ms,
             signed_percent(100 * (s.makespan_ms / s.store_all_makespan_ms - 1)),
             format_bytes(store_all));
  if (args.offload)
    fmt::print(
        "offload    {} over a link of {:.3g} GB/s out, {:.3g} GB/s back, {:.3g} ms a copy: "
        "copies waited for {:.2f} ms, host memory {}{}\n",
        counted(s.simulation.offloads, "checkpoint"), chain.link->d2h_gbps, chain.link->h2d_gbps,
        chain.link->latency_ms, s.simulation.copy_wait_ms,
        format_bytes(s.simulation.host_peak_bytes),
        args.host_memory.empty() ? std::string() : " of at most " + args.host_memory);
  fmt::print("\n");
  if (dp)
    fmt::print("{:>6} {:>12} {:>14} {:>12} {:>14} {:>8}\n", "step", "time", "peak", "loss",
               "all-reduce", "hidden");
  else
    fmt::print("{:>6} {:>12} {:>14} {:>12}\n", "step", "time", "peak", "loss");
  std::fflush(stdout);
}

// What the steps measured.
struct StepLog {
  std::vector<double> times, all_reduce, hidden;
  std::int64_t worst_peak = 0;
};

// One step's line, and its data-parallel times into `log`.
void log_step(int step, double ms, std::int64_t peak, double loss_value,
              const distributed::DataParallel* dp, bool speak, StepLog& log) {
  log.times.push_back(ms);
  log.worst_peak = std::max(log.worst_peak, peak);
  if (dp) {
    const distributed::StepTimes& t = dp->last_step();
    // Not measured on a GPU (NaN: distributed/data_parallel.h), where "exposed" is shown.
    const bool known = !std::isnan(t.all_reduce_ms);
    log.all_reduce.push_back(known ? t.all_reduce_ms : t.exposed_ms);
    if (known)
      log.hidden.push_back(t.all_reduce_ms > 0 ? 100 * t.hidden_ms / t.all_reduce_ms : 100);
    if (speak && known)
      fmt::print("{:>6} {:>9.1f} ms {:>14} {:>12.5f} {:>11.1f} ms {:>7.0f}%\n", step, ms,
                 format_bytes(peak), loss_value, t.all_reduce_ms, log.hidden.back());
    else if (speak)
      fmt::print("{:>6} {:>9.1f} ms {:>14} {:>12.5f} {:>11.1f} ms exposed\n", step, ms,
                 format_bytes(peak), loss_value, t.exposed_ms);
  } else if (speak) {
    fmt::print("{:>6} {:>9.1f} ms {:>14} {:>12.5f}\n", step, ms, format_bytes(peak), loss_value);
  }
  std::fflush(stdout);
}

// The training steps with the schedule, into `log`: kExitOk, or kExitOutOfMemory after saying
// which step ran out.
int run_steps(const TrainArgs& args, const ModelInput& in, torch::nn::Sequential& net,
              Checkpointable& chk, const Solution& s, const torch::Tensor& target,
              const std::optional<distributed::Environment>& env,
              const std::shared_ptr<distributed::Group>& group, distributed::DataParallel* dp,
              const std::unique_ptr<TokenFile>& token_file, const InjectedFault& fault,
              bool speak, StepLog& log) {
  MemoryTracker& tracker = MemoryTracker::for_device(in.device);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(args.lr).momentum(0.9));
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
    if (speak && !args.trace_file.empty() && step + 1 == args.steps)
      chk->trace_next_step(in.device.is_cpu());
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
    bar.clear();
    log_step(step + 1, ms, peak, loss_value, dp, speak, log);
  }
  bar.finish(args.steps, "steps");
  return kExitOk;
}

// Measured against predicted, the traced step written and summed up, the all-reduce's times.
void print_summary(const TrainArgs& args, const ModelInput& in, Checkpointable& chk,
                   const Solution& s, std::int64_t budget, const StepLog& log, bool data_parallel) {
  fmt::print("\n{:<12} {:>14} {:>16}\n", "", "peak", "step time");
  fmt::print("{:<12} {:>14} {:>13.1f} ms  (median of {}{})\n", "measured",
             format_bytes(log.worst_peak), median(log.times), log.times.size(),
             data_parallel ? ", rank 0" : "");
  fmt::print("{:<12} {:>14} {:>13.1f} ms\n", "predicted", format_bytes(s.peak_bytes),
             s.makespan_ms);
  fmt::print("{:<12} {:>14}\n", "budget", format_bytes(budget));
  if (s.simulation.offloads > 0)
    fmt::print("host memory  {} at most in a step (predicted {}), {} kept between steps\n",
               format_bytes(chk->host_memory().peak_bytes),
               format_bytes(s.simulation.host_peak_bytes), format_bytes(chk->host_memory().held_bytes));
  if (!args.trace_file.empty()) {
    const TraceSummary t = summarize_trace(chk->last_trace());
    write_text_file(args.trace_file,
                    chrome_trace(chk->last_trace(), s,
                                 in.label(args.batch) + ", " + args.algorithm + " for " +
                                     format_bytes(budget)),
                    "the trace");
    fmt::print(
        "traced       step {} into {}, measured (predicted) ms: forwards {:.1f} ({:.1f}), {} "
        "recomputation(s) {:.1f} ({:.1f}), backwards {:.1f} ({:.1f}), between operations "
        "{:.2f}\n",
        args.steps, printable(args.trace_file), t.forward.measured_ms, t.forward.predicted_ms,
        t.recompute.operations, t.recompute.measured_ms, t.recompute.predicted_ms,
        t.backward.measured_ms, t.backward.predicted_ms, t.between_ms);
  }
  if (data_parallel && log.hidden.empty())
    fmt::print(
        "all-reduce   {:.1f} ms per step (median) after the backward's end; on a GPU its own "
        "time and the part the backward hid are not measured\n",
        median(log.all_reduce));
  else if (data_parallel)
    fmt::print("all-reduce   {:.1f} ms per step (median), {:.0f}% of it hidden by the backward\n",
               median(log.all_reduce), median(log.hidden));
}

// A measured peak above the budget: with a chain file, the file's fault (exit 2); else
// remat's (exit 1).
int peak_over_budget(const TrainArgs& args, const ModelInput& in, std::int64_t worst_peak,
                     std::int64_t budget, const std::optional<distributed::Environment>& env,
                     const std::shared_ptr<distributed::Group>& group) {
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

  const Chain chain = job_chain(args, in, net, sample, target, group, speak);
  Checkpointable chk(net);
  chk->set_chain(chain);  // refuses a chain of another length
  check_chain_input(args, in, chain, sample);

  // The schedule. Percentages are of the store-all peak as the runtime needs it; a budget is
  // per rank.
  SolveOptions solve_options(0);
  solve_options.algorithm(algorithm)
      .offload(args.offload)
      .host_memory_bytes(host_memory_option(args.host_memory, args.offload));
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
  if (speak)
    print_plan(args, in, chain, s, budget, chk->store_all_peak(), group.get(), backend, dp.get());

  StepLog log;
  const int code = run_steps(args, in, net, chk, s, target, env, group, dp.get(), token_file,
                             fault, speak, log);
  if (code != kExitOk) return code;
  if (speak) print_summary(args, in, chk, s, budget, log, dp != nullptr);
  if (log.worst_peak > budget)
    return peak_over_budget(args, in, log.worst_peak, budget, env, group);
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

void add_train_options(CLI::App* cmd, TrainArgs& args) {
  cmd->add_option("--model", args.model, "Built-in model (see `remat models`)")->required();
  cmd->add_option("--batch", args.batch, "Batch size (per rank)")->required();
  cmd->add_option("--image", args.image, "Input height, or HxW (default: the model's)");
  cmd->add_option(
         "--budget", args.budget,
         "Activation memory (per rank): SIZE (700MiB, 2.5GiB), a % of the store-all peak, min "
         "(the least any schedule fits), or either followed by + (50%+: at least the least)")
      ->required();
  cmd->add_option("--steps", args.steps, "Training steps")->capture_default_str();
  cmd->add_option("--algorithm", args.algorithm,
                  "optimal, store-all, recompute-all, periodic or revolve")
      ->capture_default_str();
  cmd->add_option("--segments", args.segments, "Segments for periodic (default: sqrt(L))");
  cmd->add_option("--device", args.device, "cpu or cuda (cuda:N)")->capture_default_str();
  cmd->add_option("--chain", args.chain_file,
                  "Use this chain file (from `remat profile` of the same model, batch, image and "
                  "device) instead of profiling");
  cmd->add_option("--classes", args.classes, "Number of classes")->capture_default_str();
  cmd->add_option("--seq", args.sequence,
                  "Sequence length of a language model (default: its longest)");
  cmd->add_option(
      "--granularity", args.granularity,
      "Transformers: block (one stage per block, the default) or half (attention; MLP)");
  cmd->add_option("--tokens", args.tokens_file,
                  "Language models: train on this file of token ids (little-endian uint16, as "
                  "nanoGPT's train.bin) instead of random ones");
  cmd->add_option("--lr", args.lr, "SGD learning rate")->capture_default_str();
  cmd->add_option("--repeat", args.repeat, "Profiler repetitions per quantity")->capture_default_str();
  cmd->add_option("--threads", args.threads, "CPU threads for LibTorch (default: its own)");
  cmd->add_option("--nproc", args.nproc,
                  "Data-parallel: the job's number of ranks; without --rank, started here as "
                  "local processes");
  cmd->add_option("--rank", args.rank,
                  "Data-parallel across machines: this process's rank, of --nproc, meeting the "
                  "others at --master");
  cmd->add_option("--master", args.master,
                  "Data-parallel: HOST:PORT of rank 0's rendezvous (default: 127.0.0.1 and a free "
                  "port for local ranks, port 29500 with --rank)");
  cmd->add_option("--backend", args.backend,
                  "Data-parallel: auto (gloo on the CPU, nccl on CUDA), gloo or nccl")
      ->capture_default_str();
  cmd->add_option("--timeout", args.timeout_s,
                  "Data-parallel: seconds a rank waits for the others before it stops, naming "
                  "the rank that failed")
      ->capture_default_str();
  cmd->add_option("--trace", args.trace_file,
                  "Time each operation of the last step, measured against predicted, into FILE "
                  "(Chrome's trace format: chrome://tracing, Perfetto; rank 0's in a job)");
  add_offload_options(*cmd, args.offload, args.link, args.host_memory,
                      "optimal only: checkpoints may also be copied to host memory and back where "
                      "that beats keeping or recomputing them, over the device's link (measured "
                      "while profiling, or the chain's) or --link");
}

// The options' values checked before any work, in the order given here: an option that would
// change nothing is refused rather than ignored.
void check_train_args(const CLI::App& cmd, TrainArgs& args) {
  args.classes_given = cmd.count("--classes") > 0;
  if (!args.trace_file.empty()) check_output_path(args.trace_file, "the trace");
  REMAT_CHECK(args.batch >= 1, "--batch must be at least 1");
  // An option that would change nothing is refused rather than ignored.
  check_segments_option(cmd, parse_algorithm(args.algorithm), args.segments);
  REMAT_CHECK(cmd.count("--repeat") == 0 || args.chain_file.empty(),
              "--repeat applies to profiling, which --chain replaces");
  REMAT_CHECK(args.steps >= 1, "--steps must be at least 1");
  REMAT_CHECK(args.classes >= 1, "--classes must be at least 1");
  REMAT_CHECK(args.repeat >= 1 && args.repeat <= kMaxProfileRepeat,
              "--repeat must be from 1 to ", kMaxProfileRepeat);
  // SGD works in the parameters' float32: a larger rate overflows there.
  REMAT_CHECK(args.lr > 0 && args.lr <= std::numeric_limits<float>::max(), "--lr (", args.lr,
              ") must be positive and at most ", std::numeric_limits<float>::max(),
              " (float32's largest)");
  check_torch_threads(args.threads);
  REMAT_CHECK(cmd.count("--rank") == 0 || args.rank >= 0, "--rank (", args.rank,
              ") must be at least 0");
  REMAT_CHECK(cmd.count("--nproc") == 0 || args.nproc >= 1, "--nproc (", args.nproc,
              ") must be at least 1");
  REMAT_CHECK(args.nproc <= distributed::kMaxRanks, "--nproc (", args.nproc,
              ") must be at most ", distributed::kMaxRanks);
  REMAT_CHECK(args.timeout_s >= 0.2 && args.timeout_s <= 1e6,
              "--timeout must be a number of seconds from 0.2 to 1e6 (ranks beat every 50 ms "
              "at least)");
  distributed::parse_backend(args.backend);  // a bad name before any work
}

}  // namespace

Action add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = add_torch_subcommand(app, "train");
  add_train_options(cmd, *args);
  return [args, cmd]() -> int {
    check_train_args(*cmd, *args);
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
      return launch_ranks(args->nproc, args->master, args->timeout_s);
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
