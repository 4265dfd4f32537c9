#pragma once
// Executes a schedule (internal). run_forward() performs the operations before the loss and
// returns the members of x_L; run_backward() performs the rest, given y_L, and returns y_0
// (one gradient per member, undefined where there is none). Run once each:
// the graph node that owns the executor lets go of it when its backward starts. Both run with
// the executor's GPU as the current device; when either throws, the step is abandoned.
#include <torch/types.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "autocast.h"
#include "host_pool.h"
#include "remat/core/cuda_intervals.h"
#include "remat/core/stage.h"
#include "remat/core/stage_input.h"
#include "remat/profiler/memory_tracker.h"
#include "remat/runtime/checkpointable.h"
#include "remat/solver/chain.h"
#include "remat/solver/sequence.h"
#include "remat/solver/simulator.h"

namespace remat::detail {

/// A tensor's contents in host memory outside LibTorch's allocators (not counted as
/// activation memory); tensor() views them again (CPU) for copy_ or set_state.
class HostCopy {
 public:
  HostCopy() = default;
  explicit HostCopy(const torch::Tensor& t)
      : sizes_(t.sizes().vec()), dtype_(t.scalar_type()) {
    const torch::Tensor cpu = t.device().is_cpu() ? t.contiguous() : t.to(torch::kCPU).contiguous();
    bytes_.resize(cpu.nbytes());
    if (!bytes_.empty()) std::memcpy(bytes_.data(), cpu.data_ptr(), bytes_.size());
    present_ = true;
  }
  bool empty() const { return !present_; }
  torch::Tensor tensor() const {
    return torch::from_blob(const_cast<char*>(bytes_.data()), sizes_, torch::TensorOptions().dtype(dtype_));
  }
  bool operator==(const HostCopy& other) const {
    return present_ == other.present_ && sizes_ == other.sizes_ && bytes_ == other.bytes_;
  }

 private:
  std::vector<char> bytes_;
  std::vector<std::int64_t> sizes_;
  c10::ScalarType dtype_ = c10::kByte;
  bool present_ = false;
};

/// A buffer's values, kept outside the device's memory so that they do not count against the
/// budget, and put back with restore_to. On the CPU, a HostCopy. On a GPU, pinned host memory
/// and copies in stream order, so that neither taking nor putting back waits for the GPU (a
/// copy to pageable memory would stop the host at every recomputed BatchNorm).
class BufferCopy {
 public:
  explicit BufferCopy(const torch::Tensor& t);
  /// Puts the values back into `t`, unless `t` is the tensor they were taken from and nothing
  /// has changed it since: its version counter the same (and on the CPU its values). A copy
  /// into an unchanged buffer would still count as a change of it, and the backward of a stage
  /// whose graph saved a view of it (a rotary table that every block reads) would refuse to
  /// run. (On a GPU, a stage that writes a buffer through `.data`, which no version counts, is
  /// not put back.)
  void restore_to(const torch::Tensor& t) const;
  /// Whether `t` holds the values kept here. On the CPU only: on a GPU it would wait for it.
  bool same_as_on_cpu(const torch::Tensor& t) const { return host_ == HostCopy(t); }

 private:
  HostCopy host_;
  torch::Tensor pinned_;
  const c10::TensorImpl* impl_ = nullptr;
  std::int64_t version_ = 0;
};

/// Times the operations of one traced step (CheckpointableImpl::trace_next_step): a mark
/// before and after each, CUDA events on the current stream on a GPU (the host does not wait
/// until finish()), the host's clock on the CPU. With `memory`, also the device tracker's peak
/// during each operation and its live memory after it, above the live memory before the
/// step's first operation (a reset of the tracker's peak before each; on the CPU the peak is
/// raised back at finish()). finish() writes the trace into `out`.
class StepRecorder {
 public:
  StepRecorder(c10::Device device, const Sequence& sequence, const Simulation& predicted,
               std::shared_ptr<std::vector<TracedOperation>> out, bool memory = false);
  ~StepRecorder();
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;
  void begin(std::size_t first);
  void end(std::size_t last);
  /// After the step's last operation: waits for the GPU's events, then writes the trace.
  void finish();

 private:
  Sequence sequence_;
  std::vector<double> predicted_ms_;  // per operation of the sequence
  // Per operation of the sequence, above the simulation's initial memory.
  std::vector<std::int64_t> predicted_peak_, predicted_after_;
  MemoryTracker* tracker_ = nullptr;  // null unless memory is recorded
  std::int64_t base_ = 0;             // live memory at the first operation's beginning
  std::int64_t outer_peak_ = 0;       // the tracker's peak before the resets, and during them
  std::vector<std::pair<std::int64_t, std::int64_t>> memory_;  // peak, after; above base_
  std::shared_ptr<std::vector<TracedOperation>> out_;
  std::vector<std::pair<std::size_t, std::size_t>> operations_;  // first, last
  std::unique_ptr<CudaIntervals> cuda_;                          // null on the CPU
  std::vector<std::chrono::steady_clock::time_point> clock_;     // the CPU's marks
};

class Executor {
 public:
  /// `chain` says which members have gradients and which are carried; the stages must return
  /// what it says (a stage that does not is refused with c10::ValueError).
  /// `pool`: the host memory of the offloads (O_i, E_i, P_i), where the sequence has any.
  Executor(const std::vector<NamedStage>& stages, const Chain& chain, const Sequence& sequence,
           c10::Device device, std::shared_ptr<HostPool> pool = nullptr);
  /// Gives back the host blocks of a step dropped before its backward (after waiting for its
  /// copies, on a GPU).
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  /// `parameters`: each stage's, as the step found them (watched for in-place changes).
  Tensors run_forward(const Tensors& inputs, const Tensors& context,
                      const std::vector<Tensors>& parameters);
  Tensors run_backward(Tensors grad_outputs);
  /// Times this step's operations into `recorder` (before run_forward).
  void record_with(std::shared_ptr<StepRecorder> recorder) { recorder_ = std::move(recorder); }
  /// Before run_backward, for a backward asked for some tensors only: nothing accumulates
  /// into .grad; the gradients of `wanted` (parameters of the stages; an undefined tensor for
  /// one not asked for) are summed over the stages' backwards, and then
  /// captured_gradients() has them in that order.
  void capture_gradients(Tensors wanted);
  Tensors captured_gradients() { return std::move(captured_); }

 private:
  const Tensors& input_of(int i) const;
  Tensors call(int i, const Tensors& x);
  // Where an error of stage i's forward happened, for its message.
  std::string failed_in(int i) const;
  // Runs operation `index` of the sequence (with the backward operations fused with it, see
  // backward_end_), then drops the values no later forward reads. Returns the index of the last
  // operation it ran.
  std::size_t run(std::size_t index);
  void drop_values(std::size_t index);
  // Before a forward of stage i: the first one saves the generator states; later ones set
  // them to the saved ones and snapshot the stage's buffers. After it: restore the caller's
  // generator states, and the buffers unless autograd saved them (then after B_i).
  void before_forward(int i);
  void after_forward(int i, bool keeps_graph);
  void restore_buffers(int i);
  // B_i, B_{i-1}, ..., B_j: sequence operations first..last, in one engine call.
  void backward(std::size_t first, std::size_t last);
  // The copies of docs/cost-model.md, "Offload": O_k starts copying x_k's storages to host
  // blocks, E_k waits for that copy (on a GPU, the compute stream does) and drops x_k, P_k
  // allocates x_k's storages again and starts copying them back; the first read of a
  // prefetched x_k (arrive) waits for that copy and gives the blocks back.
  void offload(int k);
  void evict(int k);
  void prefetch(int k);
  void arrive(int k);
  // Waits for every copy in flight and gives every host block back (abandon, destructor).
  void release_copies() noexcept;
  // After a failure (out of memory) in either phase: restores what a recomputation in flight
  // changed (the caller's generator states, pending buffer snapshots) and frees every tensor.
  void abandon() noexcept;

  // Copies: the module may get a new sequence between this step's forward and backward.
  std::vector<NamedStage> stages_;
  std::vector<std::vector<Member>> members_;  // members_[k]: the members of x_k
  Sequence sequence_;
  c10::Device device_;
  int length_;
  std::size_t loss_index_ = 0;
  // Which members of x_0 the caller wants gradients of.
  std::vector<bool> input_requires_grad_;
  Tensors context_;
  // What the recomputations read besides the activations (the input's members, the context,
  // every stage's parameters), with their version counters at the forward: one changed in
  // place before the backward would be recomputed from other values, where plain autograd
  // refuses the backward.
  // Named only when one changed: stage -1 is the input, -2 the context; else a parameter.
  struct Watched {
    torch::Tensor tensor;
    std::int64_t version;
    int stage, index;
  };
  std::vector<Watched> watched_;
  void check_versions() const;
  // The operations from `first` to the loss (run_forward) or to the end (run_backward), timed
  // when recorder_ is set.
  void run_operations(std::size_t first, std::size_t end);
  std::shared_ptr<StepRecorder> recorder_;
  // capture_gradients(): whether capturing, the wanted parameters by TensorImpl, and their sums.
  bool capturing_ = false;
  std::unordered_map<const c10::TensorImpl*, std::size_t> wanted_;
  Tensors captured_;
  // The autocast state of the step's forward, in which the backward recomputes.
  AutocastState autocast_;
  // When to drop the handles on activation values (the simulator's rule).
  ValueLifetimes lifetimes_;
  // x_[k]: our handles on the members of activation x_k, held while a later forward reads it.
  std::vector<Tensors> x_;
  // Stage i run with autograd: the graph edges of its new output members (not the outputs: a
  // graph keeps what its backward needs, we keep nothing) and the nodes that receive its input
  // members' gradients (null for a member that needs none).
  std::vector<std::vector<torch::autograd::Edge>> fe_edge_;
  std::vector<std::vector<NodePtr<GradientSink>>> fe_sink_;
  // y_[k]: gradients of x_k's members (undefined: none).
  std::vector<Tensors> y_;
  Tensors output_;  // x_L as returned to the caller
  std::vector<bool> ran_;
  std::vector<HostCopy> cpu_rng_, cuda_rng_;
  HostCopy caller_cpu_rng_, caller_cuda_rng_;
  std::vector<std::vector<BufferCopy>> buffer_snapshot_;
  // A recomputed stage's buffers before its first forward of the step: each recomputation
  // starts from them, as the first forward did (a stage that reads a buffer it updates: an
  // average, spectral norm's power iteration). On the CPU, kept only if that forward changed
  // them; on a GPU always (comparing would wait for it; putting back equal values is harmless).
  std::vector<std::vector<BufferCopy>> entry_buffers_;
  std::vector<bool> restore_after_backward_;
  // A recomputed stage whose buffers are all BatchNorm statistics has a freezer
  // (StageModule::norm_freezer; null for the others): none of the copies above. Its
  // recomputations run with its BatchNorms frozen (the statistics are left exactly as they
  // are), which costs the host no transfer and the GPU no work. On a GPU a copy is a transfer
  // the host issues, several per BatchNorm: enough to hold up the kernels of the small stages
  // behind it.
  std::vector<StageModule::NormFreezer> freezers_;
  // What sets back the BatchNorms that the recomputation running now froze: called after it,
  // or by abandon().
  std::function<void()> thaw_;
  void thaw_norms() noexcept;
  // Whether the sequence forwards stage i more than once: only then are its generator
  // states recorded at its first forward.
  std::vector<bool> recomputed_;
  // A recomputed stage's output members as its first forward of the step returned them: each
  // recomputation must return the same (check_recomputed_outputs), or the gradients of that
  // forward's graph would meet tensors of other shapes, or the backward read other values.
  struct OutputShape {
    std::vector<std::int64_t> sizes;
    c10::ScalarType dtype;
    c10::Device device;
  };
  std::vector<std::vector<OutputShape>> first_outputs_;
  void check_recomputed_outputs(int i, const Tensors& out);
  // backward_end_[k]: for a backward operation k, the last operation of the run of consecutive
  // backwards B_i, B_{i-1}, ..., B_j from k that run in one engine call, as in plain autograd
  // (one call per stage costs the engine's set-up each time, and on a GPU the hand-over to its
  // backward thread and back, while the GPU waits). A run ends at a forward, or where an
  // activation between two of its stages, or above its first, has a member carried through
  // with a gradient: that gradient is the sum of two stages' contributions, which the runtime
  // adds itself.
  std::vector<std::size_t> backward_end_;
  // Offloads. on_host_[k]: x_k's copy in host memory, one block per distinct storage of its
  // members, with where each member lies in them (the same offsets, sizes and strides come
  // back: the forwards that read it see the tensors they saw).
  struct MemberLayout {
    std::size_t storage;
    std::int64_t offset;
    std::vector<std::int64_t> sizes, strides;
    c10::ScalarType dtype;
  };
  struct OnHost {
    std::vector<HostPool::Lease> blocks;
    std::vector<MemberLayout> members;
    bool evicting = false;  // between O_k and E_k
    bool returned = false;  // between P_k and the first read of x_k
    std::shared_ptr<c10::Event> copied_out, copied_back;  // GPU: the copies' ends
  };
  std::shared_ptr<HostPool> pool_;
  std::vector<OnHost> on_host_;
  // GPU: one stream per direction, as the cost model's copy engines.
  std::optional<c10::Stream> to_host_, to_device_;
  bool copies_ = false;  // whether the sequence has any
};

}  // namespace remat::detail
