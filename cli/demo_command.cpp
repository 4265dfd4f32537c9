// remat demo: the whole story on a small network, on CPU, in well under a minute: profile,
// time against budget, a schedule at about half the store-all peak, and training steps with
// it, measured against predicted.
#include <fmt/format.h>
#include <torch/nn/modules/loss.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#include "cli.h"
#include "remat/models.h"
#include "remat/profiler.h"
#include "remat/runtime.h"
#include "torch_common.h"

namespace remat::cli {
namespace {

struct DemoArgs {
  std::string model = "resnet50";
  int batch = 16;
  int image = 64;
  int sequence = kSequenceNotGiven;
  std::string granularity;
  int steps = 4;
  std::string budget = "50%";
};

// 1. Profile: the chain of `net`, with a line on what is measured.
Chain demo_profile(const DemoArgs& args, const ModelInput& in, torch::nn::Sequential& net,
                   const torch::Tensor& sample, const torch::Tensor& target) {
  fmt::print("== 1. profile {} (batch {}, {}, CPU, {} LibTorch threads)\n", in.info->name,
             args.batch,
             in.tokens() ? fmt::format("{} tokens", in.sequence)
                         : fmt::format("{}x{}", args.image, args.image),
             torch::get_num_threads());
  std::fflush(stdout);  // before the progress on stderr
  ProgressBar bar("profile " + in.info->name);
  const Profile p = profile(net, sample,
                            with_progress(ProfileOptions()
                                              .repeat(3)
                                              .loss(training_loss_of(in, target))
                                              .output_held(false)  // the steps let it go
                                              .name(in.label(args.batch)),
                                          bar));
  bar.finish(p.chain.length());
  const Chain& chain = p.chain;
  fmt::print("{}; store-all: peak {}, {:.1f} ms per step (forward + backward)\n\n",
             counted(chain.length(), "stage"), format_bytes(store_all_peak(chain)),
             chain.store_all_ms());
  return p.chain;
}

// 2. Time against budget: six budgets, each algorithm's predicted step.
void print_demo_tradeoff(const Chain& chain) {
  fmt::print("== 2. predicted time against budget\n");
  const Tradeoff t = tradeoff(chain, TradeoffOptions().points(6));
  fmt::print("{:>12} {:>18} {:>18} {:>18}\n", "budget", "optimal", "revolve", "periodic");
  auto cell = [&](const TradeoffPoint& q) {
    return q.feasible ? fmt::format("{:.1f} ms {}", q.makespan_ms,
                                    signed_percent(
                                        100 * (q.makespan_ms / t.store_all_makespan_ms - 1), 0))
                      : std::string("-");
  };
  for (std::size_t k = 0; k < t.budgets.size(); ++k)
    fmt::print("{:>12} {:>18} {:>18} {:>18}\n", format_bytes(t.budgets[k]), cell(t.optimal[k]),
               cell(t.revolve[k]), cell(t.periodic_best[k]));
}

// 3. The schedule for --budget, or for the least budget where that is below it; `budget` is
// set to the one solved.
const Solution& demo_schedule(const DemoArgs& args, Checkpointable& chk, std::int64_t& budget) {
  budget = parse_budget(args.budget, chk->store_all_peak(), [&] { return chk->min_budget(); });
  const Solution* solution = &chk->compute_sequence(budget);
  if (!solution->ok()) {
    fmt::print("\n{} is below the least budget any schedule meets; using that instead\n",
               args.budget);
    budget = solution->min_feasible_budget_bytes;
    solution = &chk->compute_sequence(budget);
  }
  const Solution& s = *solution;
  fmt::print("\n== 3. optimal schedule for {} ({:.0f}% of store-all)\n", format_bytes(budget),
             100.0 * static_cast<double>(budget) / static_cast<double>(chk->store_all_peak()));
  fmt::print("{}\n", collapsed_string(s.sequence));
  fmt::print("predicted: peak {}, {:.1f} ms per step ({} against store-all)\n\n",
             format_bytes(s.peak_bytes), s.makespan_ms,
             signed_percent(100 * (s.makespan_ms / s.store_all_makespan_ms - 1)));
  return s;
}

// What the steps of part 4 measured, with the schedule and without.
struct DemoSteps {
  std::vector<double> ours_ms, plain_ms;
  std::int64_t ours_peak = 0, plain_peak = 0;
  // Set where plain training ran out of memory (REMAT_DEVICE_MEMORY_LIMIT): what remat is for.
  std::string plain_out_of_memory;
};

// 4. The training steps, each with the schedule and then without; kExitOutOfMemory where a
// step with the schedule runs out, else kExitOk.
int demo_steps(const DemoArgs& args, const ModelInput& in, torch::nn::Sequential& net,
               Checkpointable& chk, const Solution& s, const torch::Tensor& sample,
               const torch::Tensor& target, const InjectedFault& fault, DemoSteps& out) {
  fmt::print("== 4. {} training steps (SGD, {})\n", args.steps,
             in.tokens() ? "causal language-model loss on random token ids"
                         : "cross-entropy on random labels");
  MemoryTracker& tracker = MemoryTracker::for_device(torch::kCPU);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  // One training step; `checkpointed`: with the schedule (where REMAT_FAULT applies).
  auto step = [&](auto&& forward, bool checkpointed, int k, double& ms, std::int64_t& peak) {
    // Zeroed in place, not released (LibTorch 2's zero_grad() sets them to none): the
    // gradients stay allocated and out of the activation memory measured below.
    for (auto& param : net->parameters()) param.mutable_grad().zero_();
    const torch::Tensor x = sample.clone();
    const PeakScope scope(tracker);
    const auto start = std::chrono::steady_clock::now();
    {
      torch::Tensor loss = training_loss(in, forward(x), target);
      const torch::Tensor held =
          checkpointed ? fault.at_step(k + 1, torch::kCPU) : torch::Tensor();
      loss.backward();
    }
    ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    peak = scope.peak_above_start();
    sgd.step();
  };
  // Out of memory with the schedule ends the demo (exit 4). Without it, plain training stops
  // while remat's steps go on.
  for (int k = 0; k < args.steps; ++k) {
    double ms = 0;
    std::int64_t peak = 0;
    try {
      step([&](const torch::Tensor& x) { return chk->forward(Tensors{x}); }, true, k, ms, peak);
    } catch (const c10::OutOfMemoryError& error) {
      print_step_out_of_memory("", torch::kCPU, k + 1, error, s.peak_bytes);
      return kExitOutOfMemory;
    } catch (const c10::Error& error) {
      throw std::runtime_error(
          fmt::format("step {} with the schedule: {}", k + 1, error.what_without_backtrace()));
    }
    out.ours_ms.push_back(ms);
    out.ours_peak = std::max(out.ours_peak, peak);
    if (!out.plain_out_of_memory.empty()) continue;
    try {
      step([&](const torch::Tensor& x) { return run_stages(chk->stages(), {x}); }, false, k, ms,
           peak);
    } catch (const c10::OutOfMemoryError& error) {
      out.plain_out_of_memory = error.what_without_backtrace();
      continue;
    }
    out.plain_ms.push_back(ms);
    out.plain_peak = std::max(out.plain_peak, peak);
  }
  return kExitOk;
}

// The steps' table, the verdict on the budget and what to try next; the exit code.
int print_demo_result(const DemoArgs& args, const ModelInput& in, const Solution& s,
                      std::int64_t budget, const DemoSteps& steps) {
  fmt::print("{:<24} {:>14} {:>14} {:>16}\n", "", "peak", "step (median)", "");
  if (steps.plain_out_of_memory.empty())
    fmt::print("{:<24} {:>14} {:>11.1f} ms\n", "plain autograd", format_bytes(steps.plain_peak),
               median(steps.plain_ms));
  else
    fmt::print("{:<24} {:>14}\n", "plain autograd", "out of memory");
  fmt::print("{:<24} {:>14} {:>11.1f} ms\n", "remat, measured", format_bytes(steps.ours_peak),
             median(steps.ours_ms));
  fmt::print("{:<24} {:>14} {:>11.1f} ms\n", "remat, predicted", format_bytes(s.peak_bytes),
             s.makespan_ms);
  const char* verdict = steps.ours_peak <= budget ? "within" : "ABOVE";
  if (steps.plain_out_of_memory.empty())
    fmt::print("\nmeasured peak is {:.1f}% of plain training's and {} the budget of {}\n\n",
               100.0 * static_cast<double>(steps.ours_peak) /
                   static_cast<double>(std::max<std::int64_t>(steps.plain_peak, 1)),
               verdict, format_bytes(budget));
  else
    fmt::print(
        "\nplain training ran out of memory ({}); remat's measured peak is {} the budget "
        "of {}\n\n",
        printable(steps.plain_out_of_memory), verdict, format_bytes(budget));
  if (steps.ours_peak > budget) print_peak_over_budget("", steps.ours_peak, budget);
  const bool tokens = in.tokens();
  fmt::print(
      "Next: remat profile --model {} --batch {} {} -o chain.json, then remat\n"
      "schedule / tradeoff --chain chain.json (add --plot FILE.svg for pictures).\n",
      in.info->name, args.batch,
      tokens ? fmt::format("--seq {}", in.sequence) : fmt::format("--image {}", args.image));
  if (!tokens)
    fmt::print(
        "Transformers too: remat demo --model gpt2 --batch 2 --seq 128 (GPT-2, 124M), or\n"
        "--model vit_b_16 --image 224, with --granularity half for two stages per block.\n");
  return steps.ours_peak <= budget ? kExitOk : kExitInternal;
}

// The demo; `image_given`: --image was on the command line.
int run_demo(const DemoArgs& args, bool image_given) {
  REMAT_CHECK(args.batch >= 1 && args.image >= 1 && args.steps >= 1,
              "--batch, --image and --steps must be at least 1");
  check_budget_syntax(args.budget);  // before any work; its bytes come with the chain
  const InjectedFault fault = InjectedFault::from_env();
  const models::ModelInfo& info = models::find_model(args.model);
  // A language model takes --seq (128 unless given), an image model --image (64).
  const bool tokens = info.input == models::InputKind::kTokens;
  REMAT_CHECK(!tokens || !image_given, "--image: ", info.name,
              " is a language model that takes token ids; give --seq");
  const ModelInput in = resolve_model_input(
      args.model, tokens ? "" : std::to_string(args.image), "cpu",
      tokens && args.sequence == kSequenceNotGiven ? std::min(128, info.max_sequence)
                                                   : args.sequence,
      args.granularity);
  torch::manual_seed(0);
  const int classes = 10;
  torch::nn::Sequential net = build_model(in, classes);
  const torch::Tensor sample = random_input(in, args.batch);
  const torch::Tensor target = random_target(in, args.batch, classes);
  for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);

  const Chain chain = demo_profile(args, in, net, sample, target);
  print_demo_tradeoff(chain);
  Checkpointable chk(net);
  chk->set_chain(chain);
  std::int64_t budget = 0;
  const Solution& s = demo_schedule(args, chk, budget);
  DemoSteps steps;
  const int code = demo_steps(args, in, net, chk, s, sample, target, fault, steps);
  if (code != kExitOk) return code;
  return print_demo_result(args, in, s, budget, steps);
}

}  // namespace

Action add_demo_command(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* cmd = add_torch_subcommand(app, "demo");
  cmd->add_option("--model", args->model, "Built-in model")->capture_default_str();
  cmd->add_option("--batch", args->batch, "Batch size")->capture_default_str();
  cmd->add_option("--image", args->image, "Image height and width")->capture_default_str();
  cmd->add_option("--seq", args->sequence,
                  "Language models (gpt2*): sequence length (default: 128)");
  cmd->add_option("--granularity", args->granularity, "Transformers: block or half");
  cmd->add_option("--steps", args->steps, "Training steps")->capture_default_str();
  cmd->add_option("--budget", args->budget, "Budget: SIZE, % of the store-all peak, min (the least), or either with + (at least the least)")->capture_default_str();
  return [args, cmd]() -> int { return run_demo(*args, cmd->count("--image") > 0); };
}

}  // namespace remat::cli
