#include "remat/solver/simulator.h"

#include "remat/solver/check.h"

namespace remat {

InvalidSequenceError::InvalidSequenceError(std::size_t op_index, const std::string& op,
                                           const std::string& reason)
    : std::invalid_argument(
          detail::str_cat("invalid sequence: operation ", op_index, " (", op, "): ", reason)),
      op_index_(op_index) {}

namespace {

// The set of live tensors of docs/cost-model.md: x_k (activations kept without autograd),
// xbar_k (what stage k-1 keeps for its backward, x_k included) and y_k (gradients).
class MemoryState {
 public:
  explicit MemoryState(const Chain& chain)
      : chain_(chain),
        length_(chain.length()),
        x_(static_cast<std::size_t>(length_) + 1, false),
        xbar_(static_cast<std::size_t>(length_) + 1, false),
        y_(static_cast<std::size_t>(length_) + 1, false),
        checkpoint_(static_cast<std::size_t>(length_) + 1, false) {
    set_x(0, true);
    checkpoint_[0] = true;  // the input belongs to the caller: no Fn_0 frees it
  }

  bool x(int k) const { return x_[static_cast<std::size_t>(k)]; }
  bool xbar(int k) const { return xbar_[static_cast<std::size_t>(k)]; }
  bool y(int k) const { return y_[static_cast<std::size_t>(k)]; }
  bool input_present(int k) const { return x(k) || xbar(k); }
  /// x_k was kept by CF_k: a later Fn_k must not free it (only B_k does).
  bool checkpoint(int k) const { return checkpoint_[static_cast<std::size_t>(k)]; }
  void mark_checkpoint(int k) { checkpoint_[static_cast<std::size_t>(k)] = true; }

  void set_x(int k, bool live) {
    if (x(k) == live) return;
    x_[static_cast<std::size_t>(k)] = live;
    live_.checkpoint_bytes += (live ? 1 : -1) * chain_.activation_bytes(k);
    if (!live) checkpoint_[static_cast<std::size_t>(k)] = false;
  }
  void set_xbar(int k, bool live) {
    if (xbar(k) == live) return;
    xbar_[static_cast<std::size_t>(k)] = live;
    live_.saved_bytes +=
        (live ? 1 : -1) * chain_.stages[static_cast<std::size_t>(k - 1)].saved_bytes;
  }
  void set_y(int k, bool live) {
    if (y(k) == live) return;
    y_[static_cast<std::size_t>(k)] = live;
    live_.gradient_bytes += (live ? 1 : -1) * chain_.activation_bytes(k);
  }
  const MemoryBreakdown& live() const { return live_; }

 private:
  const Chain& chain_;
  int length_;
  std::vector<bool> x_, xbar_, y_, checkpoint_;
  MemoryBreakdown live_;
};

}  // namespace

Simulation simulate(const Chain& chain, const Sequence& sequence, TimeModel time) {
  const int length = chain.length();
  REMAT_CHECK(length > 0, "cannot simulate an empty chain");
  MemoryState state(chain);
  std::vector<bool> backpropagated(static_cast<std::size_t>(length), false);
  Simulation sim;
  sim.peak_bytes = state.live().total();
  sim.trace.reserve(sequence.size());
  double now = 0;

  for (std::size_t index = 0; index < sequence.size(); ++index) {
    const Op& op = sequence[index];
    auto reject = [&](const std::string& reason) {
      throw InvalidSequenceError(index, op.str(), reason);
    };
    if (index > 0 && sequence[index - 1] == bwd(0)) reject("operations after B_0");
    const int i = op.stage;
    if (op.kind != OpKind::kLoss && (i < 0 || i >= length))
      reject(detail::str_cat("stage ", i, " is outside the chain's stages 0..", length - 1));
    if (op.is_forward()) {
      if (!state.input_present(i)) reject(detail::str_cat("its input x_", i, " is not in memory"));
      if (backpropagated[static_cast<std::size_t>(i)])
        reject(detail::str_cat("stage ", i, " was already backpropagated"));
    }

    OpRecord record;
    record.op = op;
    double cost = 0;
    std::int64_t temporary = 0;
    const Stage* stage =
        op.kind == OpKind::kLoss ? nullptr : &chain.stages[static_cast<std::size_t>(i)];
    switch (op.kind) {
      case OpKind::kForwardGrad:
        if (state.xbar(i + 1))
          reject(
              detail::str_cat("stage ", i, " already holds its autograd state (xbar_", i + 1, ")"));
        state.set_xbar(i + 1, true);
        cost = stage->fwd_ms;
        temporary = stage->fwd_tmp_bytes;
        ++sim.grad_forwards;
        break;
      case OpKind::kForwardNoGrad:
      case OpKind::kForwardCheckpoint:
        if (state.x(i + 1)) reject(detail::str_cat("x_", i + 1, " is already in memory"));
        state.set_x(i + 1, true);
        if (op.kind == OpKind::kForwardCheckpoint && state.x(i)) state.mark_checkpoint(i);
        cost = time.use_nograd_time ? stage->nograd_ms() : stage->fwd_ms;
        temporary = stage->fwd_tmp_bytes;
        ++sim.nograd_forwards;
        break;
      case OpKind::kLoss:
        if (!state.input_present(length))
          reject(detail::str_cat("the output x_", length, " is not in memory"));
        if (state.y(length)) reject("the loss was already computed");
        state.set_y(length, true);
        temporary = chain.loss_tmp_bytes;
        break;
      case OpKind::kBackward:
        if (backpropagated[static_cast<std::size_t>(i)])
          reject(detail::str_cat("gradient y_", i, " computed twice"));
        if (!state.y(i + 1)) reject(detail::str_cat("gradient y_", i + 1, " is not in memory"));
        if (!state.xbar(i + 1))
          reject(detail::str_cat("stage ", i, " holds no autograd state (run Fe_", i, " first)"));
        if (!state.input_present(i))
          reject(detail::str_cat("its input x_", i, " is not in memory"));
        state.set_y(i, true);
        cost = stage->bwd_ms;
        temporary = stage->bwd_tmp_bytes;
        break;
    }
    record.during = state.live();
    record.during.temporary_bytes = temporary;
    // What the operation frees once it is done.
    if (op.kind == OpKind::kForwardNoGrad) {
      // A checkpoint stays until B_i; an input held only inside xbar_i stays with stage i-1.
      if (!state.checkpoint(i)) state.set_x(i, false);
    } else if (op.kind == OpKind::kLoss) {
      state.set_x(length, false);  // a plain output is done with; xbar_L waits for B_{L-1}
    } else if (op.kind == OpKind::kBackward) {
      state.set_x(i, false);
      state.set_y(i + 1, false);
      state.set_xbar(i + 1, false);
      backpropagated[static_cast<std::size_t>(i)] = true;
    }
    record.start_ms = now;
    now += cost;
    record.end_ms = now;
    record.live_after_bytes = state.live().total();
    if (record.during.total() > sim.peak_bytes) {
      sim.peak_bytes = record.during.total();
      sim.peak_op = static_cast<std::ptrdiff_t>(index);
    }
    sim.trace.push_back(record);
  }
  if (sequence.empty()) throw InvalidSequenceError(0, "-", "the sequence is empty");
  if (sequence.back() != bwd(0))
    throw InvalidSequenceError(sequence.size() - 1, sequence.back().str(),
                               "the sequence does not end with B_0 (gradients missing)");
  sim.makespan_ms = now;
  return sim;
}

}  // namespace remat
