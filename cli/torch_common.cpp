#include "torch_common.h"

#include <fmt/core.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include "remat/config.h"
#include "remat/solver/units.h"

namespace remat::cli {
namespace {

// "224" or "224x160" -> {H, W}.
std::pair<int, int> parse_image(const std::string& text) {
  const auto bad = [&] {
    return std::invalid_argument("bad --image '" + text +
                                 "': expected H or HxW, such as 224 or 299x299");
  };
  const auto number = [&](const std::string& part) {
    if (part.empty() || part.size() > 6 || part.find_first_not_of("0123456789") != std::string::npos)
      throw bad();
    const int value = std::stoi(part);
    if (value < 1) throw bad();
    return value;
  };
  const auto x = text.find('x');
  if (x == std::string::npos) return {number(text), number(text)};
  return {number(text.substr(0, x)), number(text.substr(x + 1))};
}

}  // namespace

std::string ModelInput::label(int batch) const {
  return fmt::format("{} b{} {}x{} {}", info->name, batch, height, width, device.str());
}

ModelInput resolve_model_input(const std::string& model, const std::string& image,
                               const std::string& device) {
  ModelInput in;
  in.info = &models::find_model(model);
  std::tie(in.height, in.width) =
      image.empty() ? std::pair<int, int>{in.info->default_image, in.info->default_image}
                    : parse_image(image);
  if (in.height < in.info->min_image || in.width < in.info->min_image)
    throw std::invalid_argument(fmt::format("--image {}x{} is too small for {} (at least {}x{})",
                                            in.height, in.width, in.info->name,
                                            in.info->min_image, in.info->min_image));
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

LossFunction classification_loss_of(torch::Tensor target) {
  return [target = std::move(target)](const Tensors& outputs) {
    return models::classification_loss(outputs, target);
  };
}

ProfileOptions with_progress(ProfileOptions options, ProgressBar& bar) {
  return options.progress([&bar](int stage, int total, const std::string& name) {
    if (stage < total) bar.update(stage, total, name);
  });
}

std::string shape_string(const std::vector<std::int64_t>& sizes) {
  std::string out;
  for (std::size_t i = 0; i < sizes.size(); ++i) out += (i ? "x" : "") + std::to_string(sizes[i]);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace remat::cli
