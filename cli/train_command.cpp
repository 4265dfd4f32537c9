// remat train: real training steps (SGD on random data) with a schedule, printing per-step
// time, peak activation memory and loss, against the schedule's prediction.
#include <fmt/core.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "cli.h"
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
  int sequence = 0;
  std::string granularity;
  std::string tokens_file;
  double lr = 0.01;
  int threads = 0;
  int repeat = 3;
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

}  // namespace

Action add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = add_torch_subcommand(app, "train");
  cmd->add_option("--model", args->model, "Built-in model (see `remat models`)")->required();
  cmd->add_option("--batch", args->batch, "Batch size")->required();
  cmd->add_option("--image", args->image, "Input height, or HxW (default: the model's)");
  cmd->add_option("--budget", args->budget,
                  "Activation memory: SIZE (700MiB, 2.5GiB) or a % of the store-all peak")
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
  return [args]() -> int {
    REMAT_CHECK(args->batch >= 1, "--batch must be at least 1");
    REMAT_CHECK(args->steps >= 1, "--steps must be at least 1");
    REMAT_CHECK(args->classes >= 1, "--classes must be at least 1");
    REMAT_CHECK(args->repeat >= 1, "--repeat must be at least 1");
    REMAT_CHECK(args->lr > 0, "--lr must be positive");
    const Algorithm algorithm = parse_algorithm(args->algorithm);
    const ModelInput in = resolve_model_input(args->model, args->image, args->device,
                                              args->sequence, args->granularity);
    std::unique_ptr<TokenFile> token_file;
    if (!args->tokens_file.empty()) {
      if (!in.tokens())
        throw std::invalid_argument("--tokens: " + in.info->name +
                                    " takes images; --tokens is for the language models (gpt2*)");
      token_file = std::make_unique<TokenFile>(args->tokens_file, in.sequence, in.info->vocab_size);
    }
    if (args->threads > 0) torch::set_num_threads(args->threads);

    torch::manual_seed(0);
    torch::nn::Sequential net = build_model(in, args->classes);
    net->to(in.device);
    net->train();
    // Gradients exist before the first step, as after any step: they are not activations.
    for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
    const torch::Tensor sample = random_input(in, args->batch);
    const torch::Tensor target = random_target(in, args->batch, args->classes);

    // The chain: measured now, or a file measured earlier.
    Chain chain;
    if (args->chain_file.empty()) {
      ProgressBar bar("profile " + in.info->name);
      try {
        chain = profile(net, sample,
                        with_progress(ProfileOptions()
                                          .repeat(args->repeat)
                                          .name(in.label(args->batch))
                                          .loss(training_loss_of(in, target)),
                                      bar))
                    .chain;
      } catch (const ProfileError& error) {
        throw std::invalid_argument(in.info->name + ": " + error.what_without_backtrace());
      }
      bar.finish(chain.length());
    } else {
      chain = load_chain(args->chain_file);
    }
    Checkpointable chk(net);
    chk->set_chain(chain);  // refuses a chain of another length
    // A chain measured at another batch, image size or dtype has other sizes throughout: its
    // schedule would not fit the budget.
    const std::int64_t input_bytes =
        counted_bytes(in.device, static_cast<std::int64_t>(sample.nbytes()));
    if (chain.input_bytes() != input_bytes)
      throw std::invalid_argument(fmt::format(
          "--chain {}: the chain's input is {} bytes, but {} takes {} ({} bytes): it was "
          "profiled for another batch, image size or device; profile this one "
          "(remat profile --model {} --batch {} ...)",
          args->chain_file, chain.input_bytes(), in.label(args->batch),
          shape_string(sample.sizes().vec()), input_bytes, in.info->name, args->batch));

    // The schedule. Percentages are of the store-all peak as the runtime needs it.
    const std::int64_t budget = parse_budget(args->budget, chk->store_all_peak());
    SolveOptions solve_options(budget);
    solve_options.algorithm(algorithm);
    if (args->segments > 0) solve_options.segments(args->segments);
    const Solution& s = chk->compute_sequence(solve_options);
    if (!s.ok()) {
      fmt::print(stderr,
                 "remat: infeasible: {} cannot train {} in {}; it needs at least {} ({} bytes)\n",
                 args->algorithm, in.label(args->batch), format_bytes(budget),
                 format_bytes(s.min_feasible_budget_bytes), s.min_feasible_budget_bytes);
      return kExitInfeasible;
    }
    fmt::print("model      {} ({} stages)\n", in.label(args->batch), chain.length());
    fmt::print("schedule   {} for {}: {}\n", args->algorithm, format_bytes(budget),
               collapsed_string(s.sequence));
    fmt::print(
        "predicted  peak {}, {:.1f} ms per step ({:+.1f}% against store-all, whose peak is {})\n\n",
        format_bytes(s.peak_bytes), s.makespan_ms,
        100 * (s.makespan_ms / s.store_all_makespan_ms - 1), format_bytes(chk->store_all_peak()));
    std::fflush(stdout);

    // The steps.
    MemoryTracker& tracker = MemoryTracker::for_device(in.device);
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(args->lr).momentum(0.9));
    fmt::print("{:>6} {:>12} {:>14} {:>12}\n", "step", "time", "peak", "loss");
    std::vector<double> times;
    std::int64_t worst_peak = 0;
    ProgressBar bar("train " + in.info->name);
    for (int step = 0; step < args->steps; ++step) {
      bar.update(step, args->steps, "step " + std::to_string(step + 1));
      for (auto& p : net->parameters()) p.mutable_grad().zero_();
      torch::Tensor x;
      try {
        x = token_file ? token_file->next(args->batch).to(in.device)
                       : random_input(in, args->batch);
      } catch (const std::exception&) {
        bar.clear();  // the message on a line of its own
        throw;
      }
      double loss_value = 0;
      synchronize(in.device);  // the previous step's work is not this step's time
      const PeakScope scope(tracker);
      const auto start = std::chrono::steady_clock::now();
      try {
        torch::Tensor loss = training_loss(in, chk->forward(Tensors{x}), target);
        loss.backward();
        synchronize(in.device);
        loss_value = loss.item<double>();
      } catch (const c10::OutOfMemoryError& error) {
        bar.clear();
        fmt::print(stderr, "remat: out of memory on {} at step {}: {}\nThe schedule predicted a peak of {} "
                           "activations on top of the model; try a smaller --budget.\n",
                   in.device.str(), step + 1, error.what_without_backtrace(), format_bytes(s.peak_bytes));
        return kExitOutOfMemory;
      } catch (const c10::Error& error) {
        throw std::runtime_error(fmt::format("step {}: {}", step + 1, error.what_without_backtrace()));
      }
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      const std::int64_t peak = scope.peak_above_start();
      sgd.step();
      times.push_back(ms);
      worst_peak = std::max(worst_peak, peak);
      bar.clear();
      fmt::print("{:>6} {:>9.1f} ms {:>14} {:>12.5f}\n", step + 1, ms, format_bytes(peak), loss_value);
      std::fflush(stdout);
    }
    bar.finish(args->steps, "steps");
    fmt::print("\n{:<12} {:>14} {:>16}\n", "", "peak", "step time");
    fmt::print("{:<12} {:>14} {:>13.1f} ms  (median of {})\n", "measured", format_bytes(worst_peak),
               median(times), times.size());
    fmt::print("{:<12} {:>14} {:>13.1f} ms\n", "predicted", format_bytes(s.peak_bytes), s.makespan_ms);
    fmt::print("{:<12} {:>14}\n", "budget", format_bytes(budget));
    if (worst_peak > budget) {
      fmt::print(stderr, "remat: the measured peak {} exceeded the budget {}: this is a bug in remat\n",
                 format_bytes(worst_peak), format_bytes(budget));
      return kExitInternal;
    }
    return kExitOk;
  };
}

}  // namespace remat::cli
