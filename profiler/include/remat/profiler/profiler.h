#pragma once
// Measures a chain of LibTorch stages on a sample input into the cost model of
// docs/cost-model.md: per stage the forward time with and without autograd, the backward
// time, and the bytes of storage it keeps and transiently needs, so that the simulator's
// predictions hold when the runtime executes a schedule.
//
//   torch::nn::Sequential net(...);
//   remat::Profile p = remat::profile(net, torch::randn({8, 3, 64, 64}),
//                                     remat::ProfileOptions().repeat(5));
//   remat::save_chain(p.chain, "chain.json");
//
// Profiling leaves the model as it found it: parameters, gradients (absent ones stay
// absent), buffers (BatchNorm running statistics, num_batches_tracked), train/eval modes
// and the CPU (and CUDA) random generator states. Parameter gradients are allocated before
// anything is measured, so they never count as activation memory.

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "remat/profiler/memory_tracker.h"
#include "remat/solver/chain.h"
#include "remat/solver/solver.h"  // REMAT_ARG

namespace remat {

/// Called before stage `stage` (0-based) of `stages` is measured, and once at the end with
/// stage == stages.
using ProgressCallback = std::function<void(int stage, int stages, const std::string& name)>;

/// The loss of the chain's output: a tensor with one element (cross-entropy against the batch's
/// labels, say).
using LossFunction = std::function<torch::Tensor(const torch::Tensor& output)>;

struct ProfileOptions {
  /// Timed repetitions per quantity; the median is kept.
  REMAT_ARG(int, repeat) = 5;
  /// Untimed runs before timing.
  REMAT_ARG(int, warmup) = 1;
  /// A repetition runs a fast operation as many times as needed to last this long.
  REMAT_ARG(double, min_repetition_ms) = 2.0;
  /// Measure times (false: memory only, all times 0).
  REMAT_ARG(bool, measure_time) = true;
  /// The chain's name in its file; empty: "<L> stages, input <shape> <dtype> <device>".
  REMAT_ARG(std::string, name) = "";
  REMAT_ARG(ProgressCallback, progress) = nullptr;
  /// The loss the chain is trained with: its forward and backward on the chain's output are
  /// measured into the chain's loss_tmp_bytes (the logits' softmax and gradient, for a
  /// cross-entropy), which budgets then account for. Without one, loss_tmp_bytes is 0: right
  /// for a loss that allocates nothing beyond a scalar.
  REMAT_ARG(LossFunction, loss) = nullptr;
};

/// One stage to profile: a name for reports and a module mapping one tensor to one tensor.
struct NamedStage {
  std::string name;
  torch::nn::AnyModule module;
};

struct Profile {
  Chain chain;
  /// Shape of each stage's output, for reports.
  std::vector<std::vector<std::int64_t>> output_shapes;
  /// Wall time of the whole profile.
  double seconds = 0;
};

/// Bad input: a stage that does not map one tensor to one tensor, modifies its input in
/// place, fails, or lives on another device than the sample; an empty chain.
class ProfileError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// The stages of a Sequential, named as its children ("conv1"), or by index and type when
/// they are numbered ("3:Conv2d").
std::vector<NamedStage> stages_of(const torch::nn::Sequential& sequential);

/// Profiles `stages` on `sample` (on the sample's device). Throws ProfileError for bad input;
/// the model is restored in every case.
Profile profile(const std::vector<NamedStage>& stages, const torch::Tensor& sample,
                const ProfileOptions& options = ProfileOptions());
inline Profile profile(const torch::nn::Sequential& sequential, const torch::Tensor& sample,
                       const ProfileOptions& options = ProfileOptions()) {
  return profile(stages_of(sequential), sample, options);
}

/// Bytes of the storages of `tensors` as their devices' trackers count them (counted_bytes),
/// each storage once (views share storage).
std::int64_t storage_bytes(const std::vector<torch::Tensor>& tensors);

}  // namespace remat
