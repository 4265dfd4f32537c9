#pragma once
// What the LibTorch commands (profile, models, train, demo) share: choosing a built-in model,
// its input size and the device from the command line, and the profiler's progress bar.

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

#include "progress.h"
#include "remat/models/registry.h"
#include "remat/profiler/profiler.h"

namespace remat::cli {

/// A built-in model with the input the command line asked for.
struct ModelInput {
  const models::ModelInfo* info = nullptr;
  int height = 0, width = 0;
  torch::Device device{torch::kCPU};
  /// "resnet50 b32 224x224 cpu": the chain's name in its file.
  std::string label(int batch) const;
};

/// Checks --model, --image ("224" or "224x160"; empty: the model's default; at least the
/// model's minimum) and --device ("cpu", "cuda", "cuda:N": refused with a reason when this
/// build or machine has no CUDA). Throws std::invalid_argument naming the option. Applies
/// REMAT_DEVICE_MEMORY_LIMIT (a size) to the device when it is set (limit_device_memory).
ModelInput resolve_model_input(const std::string& model, const std::string& image,
                               const std::string& device);

/// models::classification_loss against `target`, as a function of the output members, for
/// ProfileOptions::loss.
LossFunction classification_loss_of(torch::Tensor target);

/// Profile options whose progress goes to `bar`.
ProfileOptions with_progress(ProfileOptions options, ProgressBar& bar);

/// "2x3x224x224".
std::string shape_string(const std::vector<std::int64_t>& sizes);

/// Median of `values` (not empty).
double median(std::vector<double> values);

}  // namespace remat::cli
