// remat train: real training steps (SGD on random data) with a schedule, printing per-step
// time, peak activation memory and loss, against the schedule's prediction.
#include <fmt/core.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <chrono>
#include <cstdio>

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
  double lr = 0.01;
  int threads = 0;
  int repeat = 3;
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
    const ModelInput in = resolve_model_input(args->model, args->image, args->device);
    if (args->threads > 0) torch::set_num_threads(args->threads);
    const auto options = torch::TensorOptions().device(in.device);

    torch::manual_seed(0);
    torch::nn::Sequential net = in.info->make(args->classes);
    net->to(in.device);
    net->train();
    // Gradients exist before the first step, as after any step: they are not activations.
    for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
    const torch::Tensor sample = torch::randn({args->batch, 3, in.height, in.width}, options);
    const torch::Tensor target = torch::randint(args->classes, {args->batch}, options.dtype(torch::kLong));

    // The chain: measured now, or a file measured earlier.
    Chain chain;
    if (args->chain_file.empty()) {
      ProgressBar bar("profile " + in.info->name);
      try {
        chain = profile(net, sample,
                        with_progress(ProfileOptions()
                                          .repeat(args->repeat)
                                          .name(in.label(args->batch))
                                          .loss(classification_loss_of(target)),
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
      const torch::Tensor x = torch::randn({args->batch, 3, in.height, in.width}, options);
      double loss_value = 0;
      synchronize(in.device);  // the previous step's work is not this step's time
      const PeakScope scope(tracker);
      const auto start = std::chrono::steady_clock::now();
      try {
        torch::Tensor loss = models::classification_loss(chk->forward(Tensors{x}), target);
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
