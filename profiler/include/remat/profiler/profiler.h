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
// Any stages (remat/core/stage.h) whose activations are tuples, with context tensors:
//
//   remat::profile(stages, {ids}, {mask}, options);
//
// Profiling leaves the model as it found it: parameters, gradients (absent ones stay
// absent), buffers (BatchNorm running statistics, num_batches_tracked), train/eval modes
// and the CPU (and CUDA) random generator states. Parameter gradients are allocated before
// anything is measured, so they never count as activation memory.

#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "remat/base/arg.h"
#include "remat/core/stage.h"
#include "remat/profiler/memory_tracker.h"
#include "remat/solver/chain.h"

namespace remat {

/// Called before stage `stage` (0-based) of `stages` is measured, and once at the end with
/// stage == stages.
using ProgressCallback = std::function<void(int stage, int stages, const std::string& name)>;

/// The loss of the chain's output: a tensor with one element (cross-entropy against the batch's
/// labels, say). A function of all the output's members (`const remat::Tensors&`), or of one
/// tensor (`const torch::Tensor&`), which is then given the first member.
class LossFunction {
 public:
  LossFunction() = default;
  LossFunction(std::nullptr_t) {}  // NOLINT(google-explicit-constructor): no loss
  template <class F,
            std::enable_if_t<std::is_invocable_r_v<torch::Tensor, F&, const Tensors&>, int> = 0>
  LossFunction(F f) : function_(std::move(f)) {}  // NOLINT(google-explicit-constructor)
  template <class F,
            std::enable_if_t<!std::is_invocable_r_v<torch::Tensor, F&, const Tensors&> &&
                                 std::is_invocable_r_v<torch::Tensor, F&, const torch::Tensor&>,
                             int> = 0>
  LossFunction(F f)  // NOLINT(google-explicit-constructor)
      : function_(
            [g = std::move(f)](const Tensors& outputs) mutable { return g(outputs.front()); }) {}
  explicit operator bool() const { return static_cast<bool>(function_); }
  torch::Tensor operator()(const Tensors& outputs) const { return function_(outputs); }

 private:
  std::function<torch::Tensor(const Tensors&)> function_;
};

/// How a stage's times are taken (docs/cost-model.md, "How times are taken").
enum class Timing {
  /// kPasses on a GPU where the chain's store-all memory fits in 80% of what the device can
  /// still hand out; else kStages.
  kAuto,
  /// Each quantity of each stage alone, its runs back to back.
  kStages,
  /// Within whole forward and backward passes over the chain, as in a training step: a stage
  /// costs its share of the device's timeline. Needs the store-all memory; out of memory,
  /// kStages.
  kPasses,
};
/// "auto", "stages" or "passes" (what `remat profile --timing` takes); throws c10::ValueError
/// for anything else.
Timing parse_timing(const std::string& text);
const char* timing_name(Timing timing);

/// The most repetitions (repeat) and warm-up runs (warmup) a profile takes: each is a run of
/// every stage, a tiny stage's about 2 ms; a larger count is refused before any work.
inline constexpr int kMaxProfileRepeat = 1000;

struct ProfileOptions {
  /// Timed repetitions per quantity; the median is kept. 1 to kMaxProfileRepeat.
  REMAT_ARG(int, repeat) = 5;
  /// Untimed runs before timing. 0 to kMaxProfileRepeat.
  REMAT_ARG(int, warmup) = 1;
  /// A repetition runs a fast operation as many times as needed to last this long, its
  /// untimed setup included (the forward before each timed backward), at most 1000 times.
  REMAT_ARG(double, min_repetition_ms) = 2.0;
  /// Measuring bounded by time rather than by counts: about this many training steps at most
  /// (steps as store-all runs them), the memory's measurement included; 0 (the default):
  /// repeat() and warmup() decide. Times are then taken within whole passes over the chain
  /// (Timing::kPasses, on the CPU too, where the chain's store-all memory fits in half of what
  /// the process may use), the memory's measurement serving as the CPU's warm-up: at least one
  /// timed pass, and more, up to repeat(), while the time spent measuring stays within
  /// max_steps() of the passes' own steps. Where passes cannot run, each stage alone, once
  /// (docs/cost-model.md, "How times are taken").
  REMAT_ARG(double, max_steps) = 0;
  /// Measure times (false: memory only, all times 0).
  REMAT_ARG(bool, measure_time) = true;
  /// How times are taken.
  REMAT_ARG(Timing, timing) = Timing::kAuto;
  /// The chain's name in its file; empty: "<L> stages, input <shape> <dtype> <device>".
  REMAT_ARG(std::string, name) = "";
  REMAT_ARG(ProgressCallback, progress) = nullptr;
  /// The loss the chain is trained with: its forward and backward on the chain's output are
  /// measured into the chain's loss_tmp_bytes (the logits' softmax and gradient, for a
  /// cross-entropy), which budgets then account for. Without one, loss_tmp_bytes is 0: right
  /// for a loss that allocates nothing beyond a scalar.
  REMAT_ARG(LossFunction, loss) = nullptr;
  /// Whether the training step keeps the chain's output until it ends (`auto out =
  /// model(x);`, then the loss and its backward, as most training loops do): the default,
  /// the loss measured with the output held and the output counted to the step's end; false
  /// for a step that lets it go once the loss has its value (`loss(model(x)).backward()`),
  /// which peaks lower by up to the output's size: a cross-entropy keeps its log-softmax, not
  /// the logits (docs/cost-model.md, "The chain's output and the loss"). Recorded as the
  /// chain's output_held.
  REMAT_ARG(bool, output_held) = true;
  /// With Timing::kPasses, the chain's restart_ms is measured on a GPU: stage 0's forward
  /// without autograd right after the backward's last engine call, less the same forward
  /// within a pass (docs/cost-model.md, "How times are taken"). On the CPU, where the backward
  /// runs on the calling thread, it is 0 unless this is set (for the tests of the measurement).
  REMAT_ARG(bool, measure_restart_on_cpu) = false;
  /// On a GPU each stage, and the loss, runs once unmeasured before its memory is measured
  /// (forward without autograd, with autograd, backward): what a first call does once and
  /// allocates for, torch.compile's autotuning of its Triton kernels or cuDNN's algorithm
  /// search under cudnn.benchmark, is then not counted (docs/cost-model.md, "How memory is
  /// measured"). On the CPU, where neither happens, only if this is set.
  REMAT_ARG(bool, warm_up_on_cpu) = false;
  /// Also measure the device's link to host memory (measure_link, with `repeat`) into the
  /// chain's `link`, which schedules that offload need (the chain is then written as
  /// remat-chain/3).
  REMAT_ARG(bool, measure_link) = false;
};

struct Profile {
  Chain chain;
  /// The shapes of each stage's output members, for reports.
  std::vector<std::vector<std::vector<std::int64_t>>> output_shapes;
  /// Wall time of the whole profile.
  double seconds = 0;
  /// How the times were taken: kStages or kPasses (kStages when none were).
  Timing timing = Timing::kStages;
};

/// Bad input: a stage that returns no tensors or undefined ones, modifies its input or the
/// context in place, fails, or lives on another device than the sample; an empty chain;
/// a context tensor that requires grad. When a stage's own code (or the loss) failed, the
/// ProfileError is thrown with std::throw_with_nested: std::rethrow_if_nested gives the
/// original exception (Python's is its __cause__).
class ProfileError : public InputError {
 public:
  using InputError::InputError;
};

/// Profiles `stages` on the sample input members `inputs` and the step's `context` tensors
/// (all on one device, where the stages run). A member of the chain's input has a gradient if
/// its sample requires grad. Throws ProfileError for bad input; the model is restored in every
/// case.
Profile profile(const std::vector<NamedStage>& stages, const Tensors& inputs,
                const Tensors& context, const ProfileOptions& options = ProfileOptions());
inline Profile profile(const std::vector<NamedStage>& stages, const torch::Tensor& sample,
                       const ProfileOptions& options = ProfileOptions()) {
  return profile(stages, Tensors{sample}, Tensors{}, options);
}
inline Profile profile(const torch::nn::Sequential& sequential, const torch::Tensor& sample,
                       const ProfileOptions& options = ProfileOptions()) {
  return profile(stages_of(sequential), Tensors{sample}, Tensors{}, options);
}

/// Measures the link between `device` and host memory (docs/cost-model.md, "Offload"), with
/// copies as the runtime makes them: on a GPU between pinned host memory and the device, on a
/// stream of their own; on the CPU between the device's (the CPU's) tensors and host memory
/// outside LibTorch's allocator. The latency is the time per copy of 64 back-to-back copies of
/// 4 KiB (the mean of the two directions); each bandwidth is `bytes` over the time of one copy
/// of `bytes` less that latency, within kMinLinkGbps..kMaxLinkGbps. Medians of `repeat`
/// measurements, after one copy each way unmeasured. Allocates `bytes` on the device and on
/// the host while it runs. Throws c10::ValueError for another device type, bytes outside 1 MiB
/// to 4 GiB or repeat outside 1 to kMaxProfileRepeat.
Link measure_link(c10::Device device, std::int64_t bytes = std::int64_t{64} << 20, int repeat = 5);

/// Bytes of the storages of `tensors` as their devices' trackers count them (counted_bytes),
/// each storage once (views share storage).
std::int64_t storage_bytes(const std::vector<torch::Tensor>& tensors);

}  // namespace remat
