#pragma once
// remat::Checkpointable: runs a chain of stages under a checkpointing schedule, with
// gradients identical to plain training.
//
//   torch::nn::Sequential net = /* any chain of stages */;
//   remat::Checkpointable chk(net);              // TORCH_MODULE-style holder
//   chk->measure(sample);                        // profile on a sample batch
//   chk->compute_sequence(700LL << 20);          // optimal schedule for 700 MiB of activations
//   torch::Tensor loss = torch::nll_loss(chk->forward(input), target);  // forward phase
//   loss.backward();                             // recomputation and backward happen here
//
// Any stages (remat/core/stage.h: C++ modules, callables, TorchScript), activations that are
// tuples, and context tensors given once per step:
//
//   remat::Checkpointable chk(stages);           // std::vector<remat::NamedStage>
//   chk->measure({ids}, {mask});
//   chk->compute_sequence(budget);
//   remat::Tensors out = chk->forward({ids}, {mask});
//
// In training mode with autograd enabled, forward() executes the operations of the schedule
// up to the loss and returns the chain's output, connected to autograd; the backward of any
// loss computed from it executes the rest (recomputations and backwards), accumulating the
// parameter gradients and returning the input's gradient. In eval mode or under
// torch::NoGradGuard, forward() runs the plain network.
//
// Recomputation is exact: each stage sees, every time it runs, the random numbers it saw the
// first time (CPU and CUDA generator states are saved per stage and restored), and its
// buffers (BatchNorm running statistics, num_batches_tracked) are updated once per step, by
// its first forward: they are restored after any later forward of the stage (after its
// backward when autograd saved them).

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "remat/core/stage.h"
#include "remat/profiler/profiler.h"
#include "remat/solver/chain.h"
#include "remat/solver/solver.h"

namespace remat {

namespace detail {
class HostPool;
}

/// The small tensors the runtime itself may hold besides activations at once (the scalar
/// roots of its inner backward calls, the caller's loss value), each of at most 32 bytes.
inline constexpr int kRuntimeReserveTensors = 8;

/// Bytes of every budget on `device` kept for those tensors: compute_sequence() solves for
/// budget - runtime_reserve_bytes(device), so that the measured peak stays within budget, and
/// reports peaks and minimums with it. The only place this policy lives: callers ask
/// Checkpointable (compute_sequence, store_all_peak, min_budget).
/// kRuntimeReserveTensors tensors of 32 bytes, in the device's units (counted_bytes): 256 bytes
/// on the CPU, 4 KiB on CUDA, whose caching allocator gives each scalar a 512-byte block.
std::int64_t runtime_reserve_bytes(c10::Device device);

/// One entry of a traced training step (CheckpointableImpl::trace_next_step): an operation of
/// the schedule, or a run of consecutive backwards B_i ... B_j that one autograd engine call
/// executed (docs/runtime.md).
struct TracedOperation {
  enum class Kind {
    kForward,        ///< a forward before the loss (the forward phase)
    kLoss,           ///< the loss operation
    kRecomputation,  ///< a forward after the loss
    kBackward,       ///< backwards (consecutive ones that one engine call ran)
    kCopy,           ///< an offload's operation: O_i, E_i or P_i (docs/runtime.md, "Offload")
  };
  /// Its operations: the traced step's sequence()[first] ... sequence()[last].
  std::size_t first = 0;
  std::size_t last = 0;
  /// As in the sequence's text: "Fe_3", "L", "B_9..7".
  std::string label;
  Kind kind = Kind::kForward;
  /// When it began, from the beginning of the step's first operation, and how long it took. On
  /// a GPU, between CUDA events recorded on the current stream before and after it: the GPU's
  /// timeline, which includes the time the GPU waited for the host's launches. On the CPU,
  /// the host's clock.
  double start_ms = 0;
  double measured_ms = 0;
  /// The chain's time for its operations (what the predicted makespan adds up).
  double predicted_ms = 0;
  /// Memory, in the device tracker's bytes (remat::counted_bytes), above the live memory before
  /// the step's first operation (its inputs, x_0, live then): the peak while the operations
  /// ran and the live memory after them. Measured only in a step traced with memory
  /// (trace_next_step(true)); -1 otherwise. Between the forward phase and the backward the
  /// caller's loss and its gradient are live too, which the prediction does not count.
  std::int64_t measured_peak_bytes = -1;
  std::int64_t measured_after_bytes = -1;
  /// The same as the simulator predicts them (Simulation::trace, above its initial_bytes).
  std::int64_t predicted_peak_bytes = 0;
  std::int64_t predicted_after_bytes = 0;
};

/// "forward", "loss", "recomputation", "backward" or "copy".
const char* traced_kind_name(TracedOperation::Kind kind);
/// The kind of each operation of `sequence`, as a traced step reports it: a forward is a
/// recomputation when it comes after the loss.
std::vector<TracedOperation::Kind> operation_kinds(const Sequence& sequence);

/// A traced step, summed by kind of operation.
struct TraceSummary {
  struct Part {
    int operations = 0;  ///< operations of the sequence (a fused run counts each backward)
    double predicted_ms = 0;
    double measured_ms = 0;
  };
  /// Forwards before the loss (the forward phase), the loss operation, forwards after it (the
  /// recomputations), the backwards, and the offloads' operations: on the compute stream, the
  /// time to start each copy and, at E_i, the wait for x_i's copy to host memory (a wait for a
  /// copy back is the time of the forward that reads it).
  Part forward, loss, recompute, backward, copy;
  /// Time between consecutive operations of a phase: the runtime's own work there (on a GPU,
  /// what of it the GPU waited for). The time between the phases is the caller's (its loss,
  /// and autograd's way to the chain's backward): `caller_ms`, in neither.
  double between_ms = 0;
  double caller_ms = 0;
  /// The step from its first operation's beginning to its last one's end, caller_ms excluded:
  /// the sum of the parts and between_ms, what the predicted makespan predicts.
  double measured_ms = 0;
  double predicted_ms = 0;
};

/// `trace` (CheckpointableImpl::last_trace) summed by kind.
TraceSummary summarize_trace(const std::vector<TracedOperation>& trace);

class CheckpointableImpl : public torch::nn::Module {
 public:
  /// Wraps `net`, whose elements are the stages of the chain (registered as "net").
  explicit CheckpointableImpl(torch::nn::Sequential net);
  /// Wraps `stages`: C++ modules are registered under their stage's name, the parameters and
  /// buffers of the others one by one ("<stage>_<k>").
  explicit CheckpointableImpl(std::vector<NamedStage> stages);
  /// Wraps `net` and measures it on `sample`.
  CheckpointableImpl(torch::nn::Sequential net, const torch::Tensor& sample);
  /// Wraps `net`, measures it on `sample` and computes the optimal sequence for `budget_bytes`.
  CheckpointableImpl(torch::nn::Sequential net, const torch::Tensor& sample,
                     std::int64_t budget_bytes);

  /// Profiles the chain on `sample` (remat::profile) and keeps the result as chain(). Records
  /// the sample's shapes, dtypes and device: forward() refuses others (and larger shapes).
  const Chain& measure(const torch::Tensor& sample,
                       const ProfileOptions& options = ProfileOptions());
  /// The same for input members and context tensors.
  const Chain& measure(const Tensors& inputs, const Tensors& context,
                       const ProfileOptions& options = ProfileOptions());
  /// Uses a chain measured earlier (e.g. loaded with remat::load_chain) instead of measuring;
  /// it must have one stage per element of the network.
  void set_chain(Chain chain);
  /// Bytes the training step takes outside the chain, which remat does not measure (rotor's
  /// loss_tmp_memory_usage: a loss given to no one): they come out of every budget with the
  /// runtime's own tensors (reserve_bytes()). 0 unless set; ValueError if negative.
  void set_outside_bytes(std::int64_t bytes);
  /// The device's link to host memory (Chain::link), which a schedule that offloads
  /// (SolveOptions::offload) needs: set on the chain (a chain file of version 3 may hold one),
  /// replaced here, or removed with nullopt. Drops the schedule computed before. Throws
  /// c10::ValueError for bandwidths or a latency outside the chain format's bounds, c10::Error
  /// without a chain.
  void set_link(std::optional<Link> link);
  std::int64_t outside_bytes() const { return outside_bytes_; }
  /// What comes out of every budget before the schedule is solved for the rest, and what every
  /// figure below includes again: runtime_reserve_bytes(device()) + outside_bytes().
  std::int64_t reserve_bytes() const;

  /// Computes the schedule forward() runs within `budget_bytes` of activation memory on
  /// device(), and returns it with its status. reserve_bytes() come out of the budget, and
  /// every figure of the returned Solution includes them: `budget_bytes` is the budget given,
  /// `peak_bytes` the predicted peak, and `min_feasible_budget_bytes` the least budget the
  /// algorithm accepts (so that store-all at store_all_peak() runs); its `simulation` is the
  /// chain's own, without them (its peak is `peak_bytes - reserve_bytes()`). A budget
  /// that cannot be met is not an exception: the status is
  /// `infeasible` (ok() is false), and forward() refuses to train until a budget that works is
  /// given. Throws c10::Error when no chain is known, c10::ValueError for bad options.
  const Solution& compute_sequence(std::int64_t budget_bytes,
                                   Algorithm algorithm = Algorithm::kOptimal);
  /// Uses `options` as given (slots, segments, threads, ...); the budget as above.
  const Solution& compute_sequence(const SolveOptions& options);
  /// The peak of store-all (every activation kept), reserve_bytes() included: the least budget
  /// for which compute_sequence returns store-all, and what percentages of a budget refer to.
  std::int64_t store_all_peak() const;
  /// The least budget compute_sequence(options) accepts (the options' budget is ignored),
  /// reserve_bytes() included.
  std::int64_t min_budget(const SolveOptions& options = SolveOptions(0)) const;

  /// The device the schedule runs on: the measured sample's, else the network's parameters'
  /// (CPU for a network without parameters).
  c10::Device device() const;
  bool has_chain() const { return chain_.has_value(); }
  const Chain& chain() const;
  /// Whether the last compute_sequence found a schedule (forward() can train).
  bool has_sequence() const { return solution_.has_value() && solution_->ok(); }
  const Solution& solution() const;
  const Sequence& sequence() const { return solution().sequence; }
  double predicted_makespan_ms() const { return solution().makespan_ms; }
  std::int64_t predicted_peak_bytes() const { return solution().peak_bytes; }

  /// In training mode with autograd, runs the schedule's forward phase; the backward phase
  /// runs when the caller's loss is differentiated. Inputs: the schedule fits the budget for
  /// the measured sample, so an input larger than it in any dimension (or, for a chain given
  /// by set_chain, in bytes) is refused with c10::ValueError (call measure() with such
  /// an input to get a schedule for it); one no larger in every dimension (the last, smaller
  /// batch of an epoch) runs the same schedule, in less memory. An input of another dtype or
  /// device than the sample's is refused (the schedule's bytes were measured for those).
  torch::Tensor forward(torch::Tensor input);
  /// The same for a chain whose activations are tuples, with the step's context tensors;
  /// returns the members of the chain's output. A member of the input that requires grad gets
  /// its gradient.
  Tensors forward(const Tensors& inputs, const Tensors& context = {});
  /// Records the operations of the next training step (this forward() and the backward of its
  /// loss): last_trace() has them once that backward has run. On a GPU, the end of that
  /// backward waits for the GPU to read the events. Steps after it are not traced. With
  /// `memory`, each operation's peak and the memory it leaves are measured too, by the
  /// device's tracker (remat::MemoryTracker), whose peak is reset before each operation: on
  /// the CPU it is raised back at the step's end, so that a measurement around the step stays
  /// whole; on a GPU the caching allocator's peak statistic (torch.cuda.max_memory_allocated)
  /// is then the last operation's.
  void trace_next_step(bool memory = false);
  /// The operations of the last traced step, in order, each with its measured and predicted
  /// time; empty until a traced step's backward has run.
  const std::vector<TracedOperation>& last_trace() const { return *last_trace_; }

  /// The host memory of the offloads (docs/runtime.md, "Offload"): blocks that hold the copies of
  /// offloaded activations, kept from step to step. `in_use_bytes`: the copies held now (0
  /// between steps); `peak_bytes`: the most held at once since reset_host_peak() (a step's is
  /// its Solution's simulation.host_peak_bytes, or less where members share a storage);
  /// `held_bytes`: the blocks kept, taken or idle; `blocks`: how many were ever allocated (a
  /// step after the first allocates none). On the CPU plain host memory, which the CPU's
  /// MemoryTracker does not count; on a GPU pinned memory.
  struct HostMemory {
    std::int64_t in_use_bytes = 0;
    std::int64_t peak_bytes = 0;
    std::int64_t held_bytes = 0;
    std::int64_t blocks = 0;
  };
  HostMemory host_memory() const;
  void reset_host_peak();
  /// Frees the host blocks no step holds.
  void free_host_memory();

  /// The wrapped network (null when constructed from stages).
  torch::nn::Sequential& network() { return net_; }
  const std::vector<NamedStage>& stages() const { return stages_; }

  void pretty_print(std::ostream& stream) const override;

 private:
  // What measure() saw of one tensor.
  struct Signature {
    std::vector<std::int64_t> sizes;
    c10::ScalarType dtype;
    c10::Device device;
  };
  // What measure() (or set_chain) saw of one parameter.
  struct ParameterSignature {
    Signature tensor;
    bool trained;
  };
  void check_inputs(const Tensors& inputs, const Tensors& context) const;
  // Each stage's parameters, as they are now: asked of each stage once (a Python stage's
  // answer costs a call into Python).
  std::vector<Tensors> stage_parameters() const;
  // Their signatures: of `parameters` (stage_parameters()), or of the stages' as they are now.
  std::vector<std::vector<ParameterSignature>> parameter_signatures(
      const std::vector<Tensors>& parameters) const;
  std::vector<std::vector<ParameterSignature>> parameter_signatures() const {
    return parameter_signatures(stage_parameters());
  }
  // Refuses a step whose parameters (this step's, `parameters`) or autocast differ from what
  // the chain was measured with.
  void check_unchanged(const Tensors& inputs, const std::vector<Tensors>& parameters) const;

  torch::nn::Sequential net_;
  std::vector<NamedStage> stages_;
  std::optional<Chain> chain_;
  // The sample's input members and context; empty after set_chain.
  std::vector<Signature> measured_inputs_, measured_context_;
  std::optional<c10::Device> measured_device_;  // the sample's device; none after set_chain
  // Each stage's parameters when the chain was measured or set: a parameter made float64,
  // moved, or unfrozen since would take the step over the budget, or lose its gradient.
  std::vector<std::vector<ParameterSignature>> measured_parameters_;
  // measure()'s autocast for the sample's device type (none after set_chain, which cannot know).
  std::optional<c10::ScalarType> measured_autocast_;
  std::optional<Solution> solution_;
  std::int64_t outside_bytes_ = 0;
  std::shared_ptr<detail::HostPool> host_pool_;
  // trace_next_step(): the next step records into a new trace, which becomes last_trace_ when
  // its backward ends (the step's executor may outlive this module: shared).
  bool trace_next_ = false;
  bool trace_memory_ = false;
  std::shared_ptr<std::vector<TracedOperation>> last_trace_ =
      std::make_shared<std::vector<TracedOperation>>();
};
TORCH_MODULE(Checkpointable);

namespace detail {
/// Whether a step runs consecutive backward operations B_i, B_{i-1}, ... in one autograd
/// engine call, as plain autograd does (the default), or one call per stage. For tests and
/// benchmarks that compare the two; read when a step starts. Returns the previous setting.
bool fuse_backward_calls(bool on);

/// fuse_backward_calls(on) for its lifetime; the previous setting after.
class FuseBackwardCalls {
 public:
  explicit FuseBackwardCalls(bool on) : previous_(fuse_backward_calls(on)) {}
  ~FuseBackwardCalls() { fuse_backward_calls(previous_); }
  FuseBackwardCalls(const FuseBackwardCalls&) = delete;
  FuseBackwardCalls& operator=(const FuseBackwardCalls&) = delete;

 private:
  bool previous_;
};
}  // namespace detail

}  // namespace remat
