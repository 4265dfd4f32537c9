#pragma once
/// The simulator: replays a sequence against a chain under the memory model of
/// docs/cost-model.md, checks that it is valid, and returns its makespan and exact peak.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "remat/solver/chain.h"
#include "remat/solver/sequence.h"

namespace remat {

/// Live memory split by what it holds.
struct MemoryBreakdown {
  /// Activation values the runtime holds: x_k (the input, checkpoints, outputs a later forward
  /// reads) and the context.
  std::int64_t checkpoint_bytes = 0;
  /// What autograd states keep for the backward, not also held as a value.
  std::int64_t saved_bytes = 0;
  /// Gradients y_k.
  std::int64_t gradient_bytes = 0;
  /// The operation's transient memory (fwd_tmp_bytes / bwd_tmp_bytes / loss_tmp_bytes).
  std::int64_t temporary_bytes = 0;

  std::int64_t total() const {
    return checkpoint_bytes + saved_bytes + gradient_bytes + temporary_bytes;
  }
};

/// What one operation did, for timelines. A copy's times are those of the copy on its engine.
struct OpRecord {
  Op op;
  double start_ms = 0;
  double end_ms = 0;
  /// Memory while the operation runs (its peak): inputs, outputs and temporaries.
  MemoryBreakdown during;
  /// Live memory once the operation is done and has freed what it frees.
  std::int64_t live_after_bytes = 0;
};

/// How operations are timed.
struct TimeModel {
  /// Use `fwd_nograd_ms` for `Fn` and `CF` (else `fwd_ms`, as the reference does).
  bool use_nograd_time = true;
};

/// The result of replaying a valid sequence.
struct Simulation {
  double makespan_ms = 0;
  /// Exact peak in bytes over the initial state (x_0) and every operation.
  std::int64_t peak_bytes = 0;
  /// Live memory before the first operation: x_0 and the context.
  std::int64_t initial_bytes = 0;
  /// Index of the operation where the peak is first reached; -1 if at the start.
  std::ptrdiff_t peak_op = -1;
  /// Number of forward operations without autograd (recomputations and checkpointing).
  std::int64_t nograd_forwards = 0;
  /// Number of forward operations with autograd.
  std::int64_t grad_forwards = 0;
  /// Number of restarts: forwards right after a backward, each Chain::restart_ms longer.
  std::int64_t restarts = 0;
  /// Number of activations offloaded (`O_i` operations).
  std::int64_t offloads = 0;
  /// Time the compute stream waited for copies: an eviction for its copy to host memory, a
  /// read of a prefetched activation for its copy back. Part of the makespan.
  double copy_wait_ms = 0;
  /// Peak of the host memory the offloaded copies hold (docs/cost-model.md, "Offload").
  std::int64_t host_peak_bytes = 0;
  std::vector<OpRecord> trace;
};

/// A sequence that cannot run: which operation and why.
class InvalidSequenceError : public std::invalid_argument {
 public:
  InvalidSequenceError(std::size_t op_index, const std::string& op, const std::string& reason);
  std::size_t op_index() const { return op_index_; }

 private:
  std::size_t op_index_;
};

/// When the runtime drops its handles on activation values (docs/cost-model.md): it holds x_k
/// from the operation that makes it until the last operation that reads it before x_k is
/// made again (forwards of stage k read x_k, the loss reads x_L). For operation p,
/// keep_input[p] says whether its input (x_i; x_L for the loss) is still needed after it, and
/// keep_output[p] whether its output x_{i+1} is (forwards only). The copies: `O_i` and `E_i`
/// read x_i (an offloaded value stays on the device until its eviction, which drops it
/// whatever keep_input says), `P_i` makes it again (keep_input[p]: whether a later operation
/// reads it). The caller's x_0 is never dropped, whatever these say.
struct ValueLifetimes {
  std::vector<bool> keep_input, keep_output;
};
ValueLifetimes value_lifetimes(const Sequence& sequence, int length);

/// Replays `sequence` on `chain`. Throws InvalidSequenceError (op index and reason) when an
/// operation's input is absent, a gradient is computed twice or never, the sequence does not
/// end with `B_0`, or a copy breaks the rules of docs/cost-model.md, "Offload" (the chain has
/// no link, x_i offloaded twice, evicted before its copy started, prefetched with no copy on
/// the host or while it is on the device).
Simulation simulate(const Chain& chain, const Sequence& sequence, TimeModel time = {});

}  // namespace remat
