// remat profile: measures a built-in model on a sample batch into a remat-chain/1 file.
#include <fmt/core.h>
#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <sstream>

#include "cli.h"
#include "progress.h"
#include "remat/models.h"
#include "remat/profiler.h"

namespace remat::cli {
namespace {

struct ProfileArgs {
  std::string model;
  int batch = 0;
  std::string image;
  std::string device = "cpu";
  int repeat = 5;
  int classes = 1000;
  std::string output;
  std::string format = "text";
  int threads = 0;
  std::string plot;
};

// "224" or "224x160" -> {H, W}.
std::pair<int, int> parse_image(const std::string& text) {
  const auto bad = [&] {
    return std::invalid_argument("bad --image '" + text + "': expected H or HxW, such as 224 or 299x299");
  };
  const auto x = text.find('x');
  const auto number = [&](const std::string& part) {
    if (part.empty() || part.size() > 6 || part.find_first_not_of("0123456789") != std::string::npos)
      throw bad();
    const int value = std::stoi(part);
    if (value < 1) throw bad();
    return value;
  };
  if (x == std::string::npos) {
    const int side = number(text);
    return {side, side};
  }
  return {number(text.substr(0, x)), number(text.substr(x + 1))};
}

std::string shape(const std::vector<std::int64_t>& sizes) {
  std::string out;
  for (std::size_t i = 0; i < sizes.size(); ++i) out += (i ? "x" : "") + std::to_string(sizes[i]);
  return out;
}

void print_table(const Profile& p) {
  const Chain& chain = p.chain;
  fmt::print("chain      {}\n", chain.name);
  fmt::print("profiled   in {:.1f} s\n\n", p.seconds);
  fmt::print("{:>4}  {:<18} {:<16} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10}\n", "#",
             "stage", "output", "fwd ms", "nograd ms", "bwd ms", "out", "saved", "fwd tmp",
             "bwd tmp");
  double fwd = 0, bwd = 0;
  for (int i = 0; i < chain.length(); ++i) {
    const Stage& s = chain.stages[static_cast<std::size_t>(i)];
    fmt::print("{:>4}  {:<18} {:<16} {:>9.3f} {:>9.3f} {:>9.3f} {:>10} {:>10} {:>10} {:>10}\n", i,
               s.name.substr(0, 18), shape(p.output_shapes[static_cast<std::size_t>(i)]), s.fwd_ms,
               s.nograd_ms(), s.bwd_ms, format_bytes(s.out_bytes), format_bytes(s.saved_bytes),
               format_bytes(s.fwd_tmp_bytes), format_bytes(s.bwd_tmp_bytes));
    fwd += s.fwd_ms;
    bwd += s.bwd_ms;
  }
  fmt::print("\ninput            {}\n", format_bytes(chain.input_bytes));
  fmt::print("forward          {:.3f} ms (with autograd), backward {:.3f} ms\n", fwd, bwd);
  fmt::print("store-all peak   {} ({} bytes): the activation memory of plain training\n",
             format_bytes(store_all_peak(chain)), store_all_peak(chain));
}

}  // namespace

Action add_profile_command(CLI::App& app) {
  auto args = std::make_shared<ProfileArgs>();
  CLI::App* cmd = app.add_subcommand(
      "profile", "Measure a built-in model on a sample batch into a chain file (remat-chain/1)");
  cmd->add_option("--model", args->model, "Built-in model (see `remat models`)")->required();
  cmd->add_option("--batch", args->batch, "Batch size of the sample input")->required();
  cmd->add_option("--image", args->image, "Input height, or HxW (default: the model's)");
  cmd->add_option("--device", args->device, "cpu or cuda (cuda:N)");
  cmd->add_option("--repeat", args->repeat, "Timed repetitions per quantity (median)");
  cmd->add_option("--classes", args->classes, "Number of classes of the classifier");
  cmd->add_option("-o,--output", args->output, "Write the chain to FILE (atomically)");
  cmd->add_option("--format", args->format, "text (table) or json (the chain) on stdout");
  cmd->add_option("--threads", args->threads, "CPU threads for LibTorch (default: its own)");
  cmd->add_option("--plot", args->plot, "Draw per-stage times and bytes into FILE.svg");
  return [args]() -> int {
    const Format format = parse_format(args->format);
    check_plot_path(args->plot);
    const models::ModelInfo& info = models::find_model(args->model);
    if (args->batch < 1) throw std::invalid_argument("--batch must be at least 1");
    if (args->repeat < 1) throw std::invalid_argument("--repeat must be at least 1");
    if (args->classes < 1) throw std::invalid_argument("--classes must be at least 1");
    const auto [height, width] =
        args->image.empty() ? std::pair<int, int>{info.default_image, info.default_image}
                            : parse_image(args->image);
    if (height < info.min_image || width < info.min_image)
      throw std::invalid_argument(fmt::format("--image {}x{} is too small for {} (at least {}x{})",
                                              height, width, info.name, info.min_image,
                                              info.min_image));
    torch::Device device(torch::kCPU);
    try {
      device = torch::Device(args->device);
    } catch (const std::exception&) {
      throw std::invalid_argument("bad --device '" + args->device + "': expected cpu, cuda or cuda:N");
    }
    if (!device.is_cpu() && !device.is_cuda())
      throw std::invalid_argument("bad --device '" + args->device + "': expected cpu, cuda or cuda:N");
    if (device.is_cuda() && !REMAT_WITH_CUDA)
      throw std::invalid_argument(
          "--device cuda: this remat was built against a LibTorch without CUDA (rebuild against "
          "a CUDA LibTorch to profile on a GPU)");
    if (device.is_cuda() && !torch::cuda::is_available())
      throw std::invalid_argument("--device cuda: no GPU is visible");
    if (args->threads > 0) torch::set_num_threads(args->threads);

    torch::manual_seed(0);
    torch::nn::Sequential net = info.make(args->classes);
    net->to(device);
    const torch::Tensor sample =
        torch::randn({args->batch, 3, height, width}, torch::TensorOptions().device(device));
    ProgressBar bar("profile " + info.name);
    ProfileOptions options;
    options.repeat(args->repeat)
        .name(fmt::format("{} b{} {}x{} {}", info.name, args->batch, height, width, device.str()))
        .progress([&](int stage, int total, const std::string& name) {
          if (stage < total) bar.update(stage, total, name);
        });
    Profile p;
    try {
      p = profile(net, sample, options);
    } catch (const ProfileError& error) {
      throw std::invalid_argument(info.name + ": " + error.what());
    }
    bar.finish(p.chain.length());
    if (!args->output.empty()) save_chain(p.chain, args->output);
    if (!args->plot.empty()) write_text_file(args->plot, profile_svg(p.chain));
    if (format == Format::kJson)
      fmt::print("{}\n", chain_to_json(p.chain));
    else
      print_table(p);
    if (!args->output.empty() && format == Format::kText)
      fmt::print("written          {}\n", args->output);
    if (!args->plot.empty() && format == Format::kText) fmt::print("plot             {}\n", args->plot);
    return kExitOk;
  };
}

}  // namespace remat::cli
