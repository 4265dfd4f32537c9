#pragma once
// What the LibTorch commands (profile, models, train, demo) share: choosing a built-in model,
// its input size and the device from the command line, and the profiler's progress bar.

#include <torch/types.h>

#include <limits>
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
  /// Image models: the input's height and width.
  int height = 0, width = 0;
  /// Language models: the sequence length.
  int sequence = 0;
  models::Granularity granularity = models::Granularity::kBlock;
  torch::Device device{torch::kCPU};
  bool tokens() const { return info->input == models::InputKind::kTokens; }
  /// "resnet50 b32 224x224 cpu", "gpt2 b4 seq1024 half cpu": the chain's name in its file.
  std::string label(int batch) const;
  /// The input's shape at `batch`: (batch, 3, height, width) or (batch, sequence).
  std::vector<std::int64_t> shape(int batch) const;
};

/// Checks --model, --image ("224" or "224x160"; empty: the model's default; at least the
/// model's minimum; square and a multiple of the patch for ViT; refused for a language model),
/// --seq (language models: 1 to the model's longest; 0: its default; refused for image
/// models), --granularity ("block" or "half", transformers only; empty: block) and --device
/// ("cpu", "cuda", "cuda:N": refused with a reason when this build or machine has no CUDA).
/// Throws std::invalid_argument naming the option. Applies REMAT_DEVICE_MEMORY_LIMIT (a size)
/// to the device when it is set (limit_device_memory).
/// --seq's value when it was not given (0 and negative lengths are refused as given).
inline constexpr int kSequenceNotGiven = std::numeric_limits<int>::min();

/// The largest side --image takes, in pixels: a 3-channel float image of this size is 48 GiB.
inline constexpr int kMaxImageSide = 65536;

ModelInput resolve_model_input(const std::string& model, const std::string& image,
                               const std::string& device, int sequence = kSequenceNotGiven,
                               const std::string& granularity = "");

/// Checks a --threads argument of the LibTorch commands: 0 (LibTorch's own default) to
/// kMaxThreads (a likely typo above); throws std::invalid_argument otherwise.
void check_torch_threads(int threads);

/// The model for `in` with `classes` classes (image models), on the CPU.
torch::nn::Sequential build_model(const ModelInput& in, int classes);
/// Refuses --classes (`given`) for a language model: its outputs are its vocabulary, and the
/// option would change nothing.
void check_classes_option(const ModelInput& in, bool given);
/// A random batch for `in` on its device: images from N(0, 1), or token ids uniform over the
/// vocabulary.
torch::Tensor random_input(const ModelInput& in, int batch);
/// Random class labels for an image model; undefined for a language model, whose labels are
/// its input.
torch::Tensor random_target(const ModelInput& in, int batch, int classes);
/// The training loss from the chain's output: models::classification_loss against `target`,
/// or a language model's own output, its loss.
torch::Tensor training_loss(const ModelInput& in, const Tensors& outputs,
                            const torch::Tensor& target);
/// training_loss as a function of the output members, for ProfileOptions::loss.
LossFunction training_loss_of(const ModelInput& in, torch::Tensor target);

/// What train and demo print when a step with the schedule runs out of memory: `who` (a rank,
/// or empty), the device, the step (from 1), the error and the schedule's predicted peak.
void print_step_out_of_memory(const std::string& who, const torch::Device& device, int step,
                              const c10::OutOfMemoryError& error, std::int64_t predicted_peak);
/// What they print when a step's measured peak exceeded the budget with a chain they
/// profiled themselves: a bug in remat.
void print_peak_over_budget(const std::string& who, std::int64_t peak, std::int64_t budget);

/// Fault injection, for the tests of train's and demo's error paths (docs/testing.md): read
/// from REMAT_FAULT, a comma-separated list of
/// - "step-error:N": step N (from 1) of checkpointed training throws a c10::Error after its
///   forward, as a failing kernel would;
/// - "hold:SIZE": every checkpointed training step keeps SIZE more bytes allocated from its
///   forward to the end of its backward, as a stage that holds on to memory would, so that
///   the measured peak exceeds the prediction;
/// - "store-thread-error:N": at step N, on each rank of a data-parallel job other than rank 0,
///   a thread that is not remat's throws std::system_error ("Connection reset by peer") and
///   nothing catches it, as LibTorch 1.13's rendezvous-store thread does when the connection
///   to rank 0's store is reset (GroupOptions::store_thread_exit_code).
/// Unset or empty: no fault. A malformed value throws std::invalid_argument naming it.
struct InjectedFault {
  int error_step = 0;
  std::int64_t hold_bytes = 0;
  int store_thread_error_step = 0;
  static InjectedFault from_env();
  /// Between step `step`'s forward and its backward: throws at error_step; the tensor to keep
  /// until the backward is done (undefined when nothing is held).
  torch::Tensor at_step(int step, torch::Device device) const;
  /// At store_thread_error_step, on a rank other than 0: the uncaught throw in another thread.
  void store_thread_at_step(int step, int rank) const;
};

/// Profile options whose progress goes to `bar`.
ProfileOptions with_progress(ProfileOptions options, ProgressBar& bar);

/// "2x3x224x224"; "scalar" for no dimensions.
std::string shape_string(const std::vector<std::int64_t>& sizes);

/// Refuses a chain file `remat profile` made for another built-in model: its name starts
/// with that model's name ("resnet34 b32 224x224 cpu" for --model resnet50, which has as
/// many stages). A chain named otherwise (by a user, by remat.profile) is not judged here.
void check_chain_model(const Chain& chain, const ModelInput& in, const std::string& path);

/// Median of `values` (not empty).
double median(std::vector<double> values);

/// `percent` with its sign and `decimals` decimals: "+12.5%", "-3.0%"; "+0.0%" for what
/// rounds to nothing (a tiny negative difference is not "-0.0%").
std::string signed_percent(double percent, int decimals = 1);

}  // namespace remat::cli
