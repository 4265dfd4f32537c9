// remat profile: measures a built-in model on a sample batch into a remat-chain/2 file.
#include <fmt/format.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstdio>
#include <filesystem>
#include <sstream>
#include <vector>

#include "cli.h"
#include "remat/models.h"
#include "remat/profiler.h"
#include "torch_common.h"

namespace remat::cli {
namespace {

struct ProfileArgs {
  std::string model;
  int batch = 0;
  std::string image;
  std::string device = "cpu";
  int repeat = 5;
  int classes = 1000;
  bool classes_given = false;
  int sequence = kSequenceNotGiven;
  std::string granularity;
  std::string output;
  std::string format = "text";
  int threads = 0;
  std::string plot;
  bool release_output = false;
  std::string timing = "auto";
  bool measure_link = false;
};

void print_table(const Profile& p, std::FILE* out) {
  const Chain& chain = p.chain;
  fmt::print(out, "chain      {}\n", printable(chain.name));
  fmt::print(out, "profiled   in {:.1f} s, {} (--timing {})\n\n", p.seconds,
             p.timing == Timing::kPasses ? "times within whole passes" : "each stage timed alone",
             timing_name(p.timing));
  fmt::print(out, "{:>4}  {:<18} {:<16} {:>9} {:>9} {:>9} {:>10} {:>6} {:>10} {:>10} {:>10}\n", "#",
             "stage", "output", "fwd ms", "nograd ms", "bwd ms", "out", "keeps", "state", "fwd tmp",
             "bwd tmp");
  double fwd = 0, bwd = 0;
  for (int i = 0; i < chain.length(); ++i) {
    const Stage& s = chain.stages[static_cast<std::size_t>(i)];
    // Which of its input (i) and output (o) the stage's backward keeps.
    const std::string keeps =
        std::string(s.saved_inputs.empty() ? "" : "i") + (s.saved_outputs.empty() ? "" : "o");
    fmt::print(
        out, "{:>4}  {:<18} {:<16} {:>9.3f} {:>9.3f} {:>9.3f} {:>10} {:>6} {:>10} {:>10} {:>10}\n",
        i, printable(s.name).substr(0, 18),
        shape_string(p.output_shapes[static_cast<std::size_t>(i)].front()), s.fwd_ms, s.nograd_ms(),
        s.bwd_ms, format_bytes(s.out_bytes()), keeps.empty() ? "-" : keeps,
        format_bytes(s.state_bytes), format_bytes(s.fwd_tmp_bytes), format_bytes(s.bwd_tmp_bytes));
    fwd += s.fwd_ms;
    bwd += s.bwd_ms;
  }
  fmt::print(out, "\ninput            {}\n", format_bytes(chain.input_bytes()));
  fmt::print(out, "output           {}\n",
             chain.output_held ? "kept by the step to its end (the default)"
                               : "let go once the loss has its value (--release-output)");
  fmt::print(out, "forward          {:.3f} ms (with autograd), backward {:.3f} ms\n", fwd, bwd);
  if (chain.link)
    fmt::print(out, "link             {:.3g} GB/s to host memory, {:.3g} GB/s back, {:.3g} ms a copy\n",
               chain.link->d2h_gbps, chain.link->h2d_gbps, chain.link->latency_ms);
  if (chain.restart_ms > 0)  // measured on a GPU (docs/cost-model.md, "The time model")
    fmt::print(out, "restart          {:.3f} ms more for a forward right after a backward\n",
               chain.restart_ms);
  fmt::print(out, "store-all peak   {} ({} bytes): the activation memory of plain training\n",
             format_bytes(store_all_peak(chain)), store_all_peak(chain));
}

}  // namespace

Action add_profile_command(CLI::App& app) {
  auto args = std::make_shared<ProfileArgs>();
  CLI::App* cmd = add_torch_subcommand(app, "profile");
  cmd->add_option("--model", args->model, "Built-in model (see `remat models`)")->required();
  cmd->add_option("--batch", args->batch, "Batch size of the sample input")->required();
  cmd->add_option("--image", args->image, "Input height, or HxW (default: the model's)");
  cmd->add_option("--device", args->device, "cpu or cuda (cuda:N)");
  cmd->add_option("--repeat", args->repeat, "Timed repetitions per quantity (median)");
  cmd->add_option("--timing", args->timing,
                  "How times are taken: stages (each alone), passes (within whole passes, as in "
                  "a step; needs the store-all memory) or auto (passes on a GPU where it fits; "
                  "the default)");
  cmd->add_option("--classes", args->classes, "Number of classes of the classifier");
  cmd->add_option("--seq", args->sequence,
                  "Sequence length of a language model (default: its longest)");
  cmd->add_option(
      "--granularity", args->granularity,
      "Transformers: block (one stage per block, the default) or half (attention; MLP)");
  cmd->add_option("-o,--output", args->output, "Write the chain to FILE (atomically)");
  cmd->add_option("--format", args->format, "text (table) or json (the chain) on stdout");
  cmd->add_option("--threads", args->threads, "CPU threads for LibTorch (default: its own)");
  cmd->add_option("--plot", args->plot, "Draw per-stage times and bytes into FILE.svg");
  cmd->add_flag("--release-output", args->release_output,
                "The training step lets the output go once the loss has its value, as "
                "`loss(model(x)).backward()` and `remat train` do (default: kept to the step's "
                "end, a bound for both)");
  cmd->add_flag("--measure-link", args->measure_link,
                "Also measure the device's link to host memory (bandwidth each way, latency of a "
                "copy) into the chain, for schedules that offload (writes remat-chain/3)");
  return [args, cmd]() -> int {
    args->classes_given = cmd->count("--classes") > 0;
    const Format format = parse_format(args->format);
    check_plot_path(args->plot);
    if (args->output == "-" && format == Format::kJson)
      throw std::invalid_argument(
          "-o - and --format json both write the chain to standard output: give one");
    if (!args->output.empty())
      check_output_path(args->output, "the chain file");  // before profiling
    if (!args->output.empty() && args->output != "-" && !args->plot.empty() &&
        std::filesystem::weakly_canonical(args->output) ==
            std::filesystem::weakly_canonical(args->plot))
      throw std::invalid_argument(
          "-o " + printable(args->output) + " and --plot " + printable(args->plot) +
          " name the same file: the plot would replace the chain; give two");
    const ModelInput in = resolve_model_input(args->model, args->image, args->device,
                                              args->sequence, args->granularity);
    check_classes_option(in, args->classes_given);
    const models::ModelInfo& info = *in.info;
    if (args->batch < 1) throw std::invalid_argument("--batch must be at least 1");
    if (args->repeat < 1 || args->repeat > kMaxProfileRepeat)
      throw std::invalid_argument(fmt::format("--repeat must be from 1 to {}", kMaxProfileRepeat));
    Timing timing = Timing::kAuto;
    try {
      timing = parse_timing(args->timing);
    } catch (const c10::ValueError&) {
      throw std::invalid_argument("--timing must be auto, stages or passes, not '" +
                                  printable(args->timing) + "'");
    }
    if (args->classes < 1) throw std::invalid_argument("--classes must be at least 1");
    check_torch_threads(args->threads);
    if (args->threads > 0) torch::set_num_threads(args->threads);

    torch::manual_seed(0);
    torch::nn::Sequential net = build_model(in, args->classes);
    net->to(in.device);
    const torch::Tensor sample = random_input(in, args->batch);
    ProgressBar bar("profile " + info.name);
    const ProfileOptions options =
        with_progress(ProfileOptions()
                          .repeat(args->repeat)
                          .timing(timing)
                          .name(in.label(args->batch))
                          .loss(training_loss_of(in, random_target(in, args->batch, args->classes)))
                          .output_held(!args->release_output)
                          .measure_link(args->measure_link),
                      bar);
    Profile p;
    try {
      p = profile(net, sample, options);
    } catch (const ProfileError& error) {
      throw std::invalid_argument(info.name + ": " + error.what_without_backtrace());
    }
    bar.finish(p.chain.length());
    // Both files or neither; `-o -` is the chain on standard output, and nothing else there.
    const std::string json = chain_to_json(p.chain) + "\n";
    std::vector<OutputFile> files;
    if (!args->output.empty()) files.push_back({args->output, json, "the chain file"});
    if (!args->plot.empty()) files.push_back({args->plot, profile_svg(p.chain), "the plot"});
    const bool chain_on_stdout = args->output == "-";
    if (format == Format::kJson) files.push_back({"-", json, "the chain"});
    write_text_files(files);
    std::FILE* text = chain_on_stdout ? stderr : stdout;
    if (format == Format::kText) {
      print_table(p, text);
      if (!args->output.empty() && !chain_on_stdout)
        fmt::print(text, "written          {}\n", printable(args->output));
      if (!args->plot.empty()) fmt::print(text, "plot             {}\n", printable(args->plot));
    }
    return kExitOk;
  };
}

}  // namespace remat::cli
