#include "torch_common.h"

#include <fmt/format.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "cli.h"
#include "remat/base/units.h"
#include "remat/config.h"
#include "remat/solver/solver.h"

namespace remat::cli {
namespace {

// "224" or "224x160" -> {H, W}.
std::pair<int, int> parse_image(const std::string& text) {
  const auto bad = [&] {
    return std::invalid_argument("bad --image '" + text +
                                 "': expected H or HxW, such as 224 or 299x299");
  };
  const auto too_large = [&] {
    return std::invalid_argument(
        fmt::format("--image '{}' is too large: a side is at most {} pixels", text, kMaxImageSide));
  };
  const auto number = [&](const std::string& part) {
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos) throw bad();
    const auto digits = part.find_first_not_of('0');
    if (digits != std::string::npos && part.size() - digits > 6) throw too_large();
    const int value = std::stoi(part);
    if (value < 1) throw bad();
    if (value > kMaxImageSide) throw too_large();
    return value;
  };
  const auto x = text.find('x');
  if (x == std::string::npos) return {number(text), number(text)};
  return {number(text.substr(0, x)), number(text.substr(x + 1))};
}

}  // namespace

std::string ModelInput::label(int batch) const {
  const std::string input =
      tokens() ? fmt::format("seq{}", sequence) : fmt::format("{}x{}", height, width);
  const std::string split = granularity == models::Granularity::kBlock
                                ? ""
                                : std::string(" ") + models::granularity_name(granularity);
  return fmt::format("{} b{} {}{} {}", info->name, batch, input, split, device.str());
}

std::vector<std::int64_t> ModelInput::shape(int batch) const {
  if (tokens()) return {batch, sequence};
  return {batch, 3, height, width};
}

ModelInput resolve_model_input(const std::string& model, const std::string& image,
                               const std::string& device, int sequence,
                               const std::string& granularity) {
  ModelInput in;
  in.info = &models::find_model(model);
  const models::ModelInfo& info = *in.info;
  if (!granularity.empty()) {
    if (info.granularities.size() < 2)
      throw std::invalid_argument("--granularity: " + info.name +
                                  " has one granularity; --granularity is for the transformers "
                                  "(vit_*, gpt2*: block or half) and Inception v3 (block or "
                                  "branch)");
    std::string names;
    for (const models::Granularity g : info.granularities)
      names += (names.empty() ? "" : " or ") + std::string(models::granularity_name(g));
    try {
      in.granularity = models::parse_granularity(granularity);
    } catch (const c10::Error&) {
      throw std::invalid_argument("bad --granularity '" + granularity + "': " + info.name +
                                  " takes " + names);
    }
    if (!info.has_granularity(in.granularity))
      throw std::invalid_argument("--granularity " + granularity + ": " + info.name + " takes " +
                                  names);
  }
  if (in.tokens()) {
    if (!image.empty())
      throw std::invalid_argument("--image: " + info.name +
                                  " is a language model that takes token ids; give --seq");
    if (sequence != kSequenceNotGiven && (sequence < 1 || sequence > info.max_sequence))
      throw std::invalid_argument(fmt::format("--seq {}: {} takes sequences of 1 to {} tokens",
                                              sequence, info.name, info.max_sequence));
    in.sequence = sequence == kSequenceNotGiven ? info.default_sequence : sequence;
  } else {
    if (sequence != kSequenceNotGiven)
      throw std::invalid_argument("--seq: " + info.name +
                                  " takes images (--image); --seq is for the language models "
                                  "(gpt2*)");
    std::tie(in.height, in.width) =
        image.empty() ? std::pair<int, int>{info.default_image, info.default_image}
                      : parse_image(image);
    if (in.height < info.min_image || in.width < info.min_image)
      throw std::invalid_argument(fmt::format("--image {}x{} is too small for {} (at least {}x{})",
                                              in.height, in.width, info.name, info.min_image,
                                              info.min_image));
    if (info.image_multiple > 0 && (in.height != in.width || in.height % info.image_multiple != 0))
      throw std::invalid_argument(fmt::format(
          "--image {}x{}: {} takes square images whose side is a multiple of {} (its patch)",
          in.height, in.width, info.name, info.image_multiple));
  }
  const auto bad_device = [&] {
    return std::invalid_argument("bad --device '" + device + "': expected cpu, cuda or cuda:N");
  };
  try {
    in.device = torch::Device(device);
  } catch (const std::exception&) {
    throw bad_device();
  }
  if (!in.device.is_cpu() && !in.device.is_cuda()) throw bad_device();
  if (in.device.is_cuda() && !REMAT_WITH_CUDA)
    throw std::invalid_argument(
        "--device cuda: this remat was built against a LibTorch without CUDA (rebuild against "
        "a CUDA LibTorch to use a GPU)");
  if (in.device.is_cuda() && !torch::cuda::is_available())
    throw std::invalid_argument("--device cuda: no GPU is visible");
  // Before any CUDA allocation, plain training's included: blocks of exactly the counted bytes.
  if (in.device.is_cuda()) exact_cuda_blocks();
  if (const char* limit = std::getenv("REMAT_DEVICE_MEMORY_LIMIT"); limit != nullptr && *limit) {
    std::int64_t bytes = 0;
    try {
      bytes = parse_size(limit);
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument(std::string("REMAT_DEVICE_MEMORY_LIMIT: ") + error.what());
    }
    limit_device_memory(in.device, bytes);
  }
  return in;
}

void check_torch_threads(int threads) {
  if (threads < 0 || threads > kMaxThreads)
    throw std::invalid_argument(fmt::format(
        "--threads ({}) must be 0 (LibTorch's own default) to {}", threads, kMaxThreads));
}

void check_classes_option(const ModelInput& in, bool given) {
  if (given && in.tokens())
    throw std::invalid_argument(fmt::format(
        "--classes: {} is a language model, whose outputs are its vocabulary ({} tokens); "
        "--classes is for the image models",
        in.info->name, in.info->vocab_size));
}

torch::nn::Sequential build_model(const ModelInput& in, int classes) {
  models::ModelConfig config;
  config.num_classes = classes;
  config.image = in.tokens() ? 0 : in.height;
  config.granularity = in.granularity;
  return in.info->build(config);
}

torch::Tensor random_input(const ModelInput& in, int batch) {
  const auto options = torch::TensorOptions().device(in.device);
  if (in.tokens())
    return torch::randint(in.info->vocab_size, in.shape(batch), options.dtype(torch::kLong));
  return torch::randn(in.shape(batch), options);
}

torch::Tensor random_target(const ModelInput& in, int batch, int classes) {
  if (in.tokens()) return {};
  return torch::randint(classes, {batch},
                        torch::TensorOptions().device(in.device).dtype(torch::kLong));
}

torch::Tensor training_loss(const ModelInput& in, const Tensors& outputs,
                            const torch::Tensor& target) {
  if (!in.tokens()) return models::classification_loss(outputs, target);
  TORCH_CHECK(outputs.size() == 1 && outputs[0].dim() == 0, in.info->name,
              ": expected the loss as the chain's output");
  return outputs[0];
}

LossFunction training_loss_of(const ModelInput& in, torch::Tensor target) {
  return [in, target = std::move(target)](const Tensors& outputs) {
    return training_loss(in, outputs, target);
  };
}

void print_step_out_of_memory(const std::string& who, const torch::Device& device, int step,
                              const c10::OutOfMemoryError& error, std::int64_t predicted_peak) {
  fmt::print(stderr,
             "remat: {}out of memory on {} at step {}: {}\nThe schedule predicted a peak of {} "
             "activations on top of the model; try a smaller --budget.\n",
             who, device.str(), step, printable(error.what_without_backtrace()),
             format_bytes(predicted_peak));
}

void print_peak_over_budget(const std::string& who, std::int64_t peak, std::int64_t budget) {
  fmt::print(stderr,
             "remat: {}the measured peak {} exceeded the budget {}: this is a bug in remat\n", who,
             format_bytes(peak), format_bytes(budget));
}

InjectedFault InjectedFault::from_env() {
  InjectedFault fault;
  const char* value = std::getenv("REMAT_FAULT");
  if (value == nullptr) return fault;
  const std::string text = value;
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument(
        fmt::format("REMAT_FAULT='{}': {} (expected step-error:N, hold:SIZE or "
                    "store-thread-error:N, comma-separated)",
                    printable(text), why));
  };
  const auto step_of = [&](const std::string& arg) {
    const std::optional<long> step = whole_number(arg, 1, 1000000);
    if (!step) throw bad("'" + arg + "' is not a step number");
    return static_cast<int>(*step);
  };
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    start = end + 1;
    const std::size_t colon = item.find(':');
    const std::string kind = item.substr(0, colon);
    const std::string arg = colon == std::string::npos ? "" : item.substr(colon + 1);
    if (kind == "step-error") {
      fault.error_step = step_of(arg);
    } else if (kind == "store-thread-error") {
      fault.store_thread_error_step = step_of(arg);
    } else if (kind == "hold") {
      try {
        fault.hold_bytes = parse_size(arg);
      } catch (const std::invalid_argument& error) {
        throw bad(error.what());
      }
    } else {
      throw bad("unknown fault '" + kind + "'");
    }
  }
  return fault;
}

void InjectedFault::store_thread_at_step(int step, int rank) const {
  if (step != store_thread_error_step || rank <= 0) return;
  std::thread([] {
    throw std::system_error(ECONNRESET, std::generic_category());
  }).detach();
  // The process ends in that thread (std::terminate); this one waits for it.
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

torch::Tensor InjectedFault::at_step(int step, torch::Device device) const {
  if (step == error_step)
    TORCH_CHECK(false, "a fault injected at step ", step, " (REMAT_FAULT=step-error:", step, ")");
  if (hold_bytes <= 0) return {};
  return torch::empty({hold_bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
}

ProfileOptions with_progress(ProfileOptions options, ProgressBar& bar) {
  return options.progress([&bar](int stage, int total, const std::string& name) {
    if (stage < total) bar.update(stage, total, name);
  });
}

std::string shape_string(const std::vector<std::int64_t>& sizes) {
  if (sizes.empty()) return "scalar";  // a language model's loss
  std::string out;
  for (std::size_t i = 0; i < sizes.size(); ++i) out += (i ? "x" : "") + std::to_string(sizes[i]);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

void check_chain_model(const Chain& chain, const ModelInput& in, const std::string& path) {
  const std::string first = chain.name.substr(0, chain.name.find(' '));
  const auto& known = models::registry();
  const bool a_model = std::any_of(known.begin(), known.end(),
                                   [&](const models::ModelInfo& m) { return m.name == first; });
  if (a_model && first != in.info->name)
    throw std::invalid_argument(fmt::format(
        "--chain {}: the chain was profiled for {} (its name is '{}'), not {}; profile this one "
        "(remat profile --model {} ...)",
        printable(path), first, printable(chain.name), in.info->name, in.info->name));
}

std::string signed_percent(double percent, int decimals) {
  const double scale = std::pow(10.0, decimals);
  const double rounded = std::round(percent * scale);
  return fmt::format("{:+.{}f}%", rounded == 0 ? 0.0 : rounded / scale, decimals);
}

}  // namespace remat::cli
