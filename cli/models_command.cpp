// remat models: the built-in models with their stage and parameter counts, or one model's
// stages with their output shapes and bytes at a given input.
#include <algorithm>
#include <fmt/format.h>
#include <torch/utils.h>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "torch_common.h"

namespace remat::cli {
namespace {

nlohmann::json granularity_names(const models::ModelInfo& info) {
  nlohmann::json names = nlohmann::json::array();
  for (const models::Granularity g : info.granularities) names.push_back(models::granularity_name(g));
  return names;
}

struct ModelsArgs {
  std::string model;
  int batch = 2;  // training mode: BatchNorm needs more than one value per channel
  std::string image;
  int sequence = kSequenceNotGiven;
  std::string granularity;
  int classes = 1000;
  bool classes_given = false;
  std::string format = "text";
};

// 11689512 -> "11,689,512".
std::string thousands(std::int64_t n) {
  std::string digits = std::to_string(n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// "2x768x17x17 + 2x10": the shapes of an activation's members.
std::string members_string(const Tensors& members) {
  std::string out;
  for (const torch::Tensor& m : members)
    out += (out.empty() ? "" : " + ") + shape_string(m.sizes().vec());
  return out;
}

int list_models(const ModelsArgs& args, Format format) {
  nlohmann::json list = nlohmann::json::array();
  if (format == Format::kText)
    fmt::print("{:<20} {:>7} {:>13} {:>10} {:>10}  {}\n", "model", "stages", "parameters",
               "input", "min input", "description");
  // Every built-in model's counts are known without building it; a model whose are not is
  // built, which initializes its weights (VGG's 140 million take seconds): show progress.
  ProgressBar bar("models");
  const auto& all = models::registry();
  for (std::size_t k = 0; k < all.size(); ++k) {
    const models::ModelInfo& info = all[k];
    bar.update(static_cast<int>(k), static_cast<int>(all.size()), info.name);
    torch::NoGradGuard no_grad;
    std::int64_t params = info.parameters_for(args.classes), stages = info.known_stages;
    if (params == 0) {
      const torch::nn::Sequential net = info.make(args.classes);
      params = models::parameter_count(*net);
      stages = static_cast<std::int64_t>(net->size());
    }
    bar.clear();
    const bool tokens = info.input == models::InputKind::kTokens;
    if (format == Format::kJson) {
      nlohmann::json entry = {
          {"name", info.name},
          {"description", info.description},
          {"stages", stages},
          {"parameters", params},
          {"input", tokens ? "tokens" : "image"},
          {"granularities", granularity_names(info)}};
      if (tokens) {
        entry["default_sequence"] = info.default_sequence;
        entry["max_sequence"] = info.max_sequence;
        entry["vocab_size"] = info.vocab_size;
      } else {
        entry["default_image"] = info.default_image;
        entry["min_image"] = info.min_image;
      }
      list.push_back(entry);
    } else {
      fmt::print("{:<20} {:>7} {:>13} {:>10} {:>10}  {}\n", info.name, stages, thousands(params),
                 tokens ? fmt::format("seq {}", info.default_sequence)
                        : fmt::format("{0}x{0}", info.default_image),
                 tokens ? "seq 1" : fmt::format("{0}x{0}", info.min_image), info.description);
      std::fflush(stdout);
    }
  }
  bar.finish(static_cast<int>(all.size()), "models");
  if (format == Format::kJson)
    fmt::print("{}\n", list.dump(2));
  else
    fmt::print(
        "\nparameters at {} classes (image models); stages at block granularity (transformers "
        "also have --granularity half: two per block; Inception v3 --granularity branch: one per "
        "branch of its Mixed blocks);\n`remat models NAME --batch B "
        "--image H` (or --seq N) lists the stages\n",
        args.classes);
  return kExitOk;
}

int show_model(const ModelsArgs& args, Format format) {
  const ModelInput in =
      resolve_model_input(args.model, args.image, "cpu", args.sequence, args.granularity);
  check_classes_option(in, args.classes_given);
  torch::manual_seed(0);
  torch::nn::Sequential net = build_model(in, args.classes);
  std::vector<NamedStage> stages = stages_of(net);
  // The shapes a training step sees (train mode: Inception's auxiliary logits included, as a
  // second member),
  // without autograd: nothing is kept but the current output.
  torch::NoGradGuard no_grad;
  torch::Tensor x = random_input(in, args.batch);
  nlohmann::json rows = nlohmann::json::array();
  if (format == Format::kText) {
    fmt::print("{}: {} stages, {} parameters, input {} ({})\n\n", in.info->name, stages.size(),
               thousands(models::parameter_count(*net)), shape_string(x.sizes().vec()),
               format_bytes(static_cast<std::int64_t>(x.nbytes())));
    fmt::print("{:>4}  {:<22} {:<18} {:>11} {:>12}\n", "#", "stage", "output", "bytes",
               "parameters");
  }
  std::int64_t total = 0;
  Tensors members = {x};
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const Tensors input = members;
    try {
      members = stages[i].module->forward(members, {});
    } catch (const c10::OutOfMemoryError&) {
      throw;
    } catch (const c10::Error& error) {
      throw std::invalid_argument(
          fmt::format("{} stage {} ({}) fails on input {}: {}", in.info->name, i, stages[i].name,
                      members_string(members), error.what_without_backtrace()));
    }
    std::int64_t bytes = 0;
    nlohmann::json shapes = nlohmann::json::array();
    for (const torch::Tensor& m : members) {
      bytes += static_cast<std::int64_t>(m.nbytes());
      shapes.push_back(m.sizes().vec());
      // A member carried from the input (the same tensor) is counted where it was made.
      const bool carried = std::any_of(input.begin(), input.end(),
                                       [&](const torch::Tensor& t) { return t.is_same(m); });
      if (!carried) total += static_cast<std::int64_t>(m.nbytes());
    }
    const std::int64_t params = models::parameter_count(*stages[i].module->nn_module());
    if (format == Format::kJson)
      rows.push_back({{"name", stages[i].name},
                      {"output_shapes", shapes},
                      {"output_bytes", bytes},
                      {"parameters", params}});
    else
      fmt::print("{:>4}  {:<22} {:<18} {:>11} {:>12}\n", i, stages[i].name.substr(0, 22),
                 members_string(members), format_bytes(bytes), thousands(params));
  }
  if (format == Format::kJson)
    fmt::print("{}\n", nlohmann::json{{"model", in.info->name},
                                      {"input_shape", in.shape(args.batch)},
                                      {"parameters", models::parameter_count(*net)},
                                      {"stages", rows}}
                           .dump(2));
  else
    fmt::print("\nall stage outputs together: {} (each storage once: what store-all keeps at "
               "least, before what\neach stage saves for its backward; `remat profile` "
               "measures that)\n",
               format_bytes(total));
  return kExitOk;
}

}  // namespace

Action add_models_command(CLI::App& app) {
  auto args = std::make_shared<ModelsArgs>();
  CLI::App* cmd = add_torch_subcommand(app, "models");
  cmd->add_option("model", args->model, "A model: list its stages");
  cmd->add_option("--batch", args->batch, "Batch size for the stage list")->capture_default_str();
  cmd->add_option("--image", args->image, "Input height, or HxW (default: the model's)");
  cmd->add_option("--seq", args->sequence, "Sequence length for a language model's stage list");
  cmd->add_option("--granularity", args->granularity, "Transformers: block or half");
  cmd->add_option("--classes", args->classes, "Number of classes")->capture_default_str();
  cmd->add_option("--format", args->format, "text or json")->capture_default_str();
  return [args, cmd]() -> int {
    args->classes_given = cmd->count("--classes") > 0;
    const Format format = parse_format(args->format);
    REMAT_CHECK(args->batch >= 1, "--batch must be at least 1");
    REMAT_CHECK(args->classes >= 1, "--classes must be at least 1");
    return args->model.empty() ? list_models(*args, format) : show_model(*args, format);
  };
}

}  // namespace remat::cli
