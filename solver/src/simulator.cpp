#include "remat/solver/simulator.h"

#include <algorithm>
#include <limits>
#include <map>

#include "remat/base/check.h"

namespace remat {

InvalidSequenceError::InvalidSequenceError(std::size_t op_index, const std::string& op,
                                           const std::string& reason)
    : std::invalid_argument(
          detail::str_cat("invalid sequence: operation ", op_index, " (", op, "): ", reason)),
      op_index_(op_index) {}

namespace {

// The live memory of docs/cost-model.md, storage by storage. Every tensor the runtime can hold
// is a storage with holders: the activation values x_k it belongs to (the runtime's handles),
// the autograd states of the stages that keep it, the gradients y_k. A storage counts once,
// while it has any holder: an output that one stage keeps and the next keeps as its input, or
// a skip carried through several activations, is one storage. Each forward makes new storages
// for its new output members (a recomputation makes new ones again); carried members are the
// input's storages.
class Memory {
 public:
  enum Holder { kValue, kGraph, kGradient };

  // A new storage of `bytes`; its holders are added with hold().
  int make(std::int64_t bytes) {
    storages_.push_back(Storage{bytes, {0, 0, 0}});
    return static_cast<int>(storages_.size()) - 1;
  }
  void hold(int id, Holder holder) { change(id, holder, +1); }
  void release(int id, Holder holder) { change(id, holder, -1); }
  const MemoryBreakdown& live() const { return live_; }
  void add_fixed(std::int64_t bytes) { live_.checkpoint_bytes += bytes; }

 private:
  struct Storage {
    std::int64_t bytes;
    int refs[3];
  };
  // Which part of the breakdown a storage counts in: activation values first (a checkpoint
  // that a stage also keeps is a checkpoint), then autograd state, then gradients.
  static std::int64_t MemoryBreakdown::*category(const Storage& s) {
    if (s.refs[kValue] > 0) return &MemoryBreakdown::checkpoint_bytes;
    if (s.refs[kGraph] > 0) return &MemoryBreakdown::saved_bytes;
    if (s.refs[kGradient] > 0) return &MemoryBreakdown::gradient_bytes;
    return nullptr;
  }
  void change(int id, Holder holder, int delta) {
    Storage& s = storages_[static_cast<std::size_t>(id)];
    const auto before = category(s);
    s.refs[holder] += delta;
    REMAT_INTERNAL_ASSERT(s.refs[holder] >= 0, "storage ", id, " released more than held");
    const auto after = category(s);
    if (before == after) return;
    if (before) live_.*before -= s.bytes;
    if (after) live_.*after += s.bytes;
  }
  std::vector<Storage> storages_;
  MemoryBreakdown live_;
};

// What a step holds while simulate() replays a sequence, as storages in Memory: the values x_k,
// the stages' autograd states, the gradients y_k. run() checks that an operation can run and
// runs it; release_after() frees what it no longer needs.
class Step {
 public:
  Step(const Chain& chain, TimeModel time)
      : chain_(chain),
        length_(chain.length()),
        time_(time),
        value_(static_cast<std::size_t>(length_) + 1),
        graph_(static_cast<std::size_t>(length_)),
        gradient_(static_cast<std::size_t>(length_) + 1),
        backpropagated_(static_cast<std::size_t>(length_), false),
        host_(static_cast<std::size_t>(length_) + 1, false),
        returned_(static_cast<std::size_t>(length_) + 1, false),
        evicting_(static_cast<std::size_t>(length_) + 1, false) {
    memory_.add_fixed(chain.context_bytes);
    for (const Member& member : chain.inputs) {
      value_[0].push_back(memory_.make(member.bytes));
      memory_.hold(value_[0].back(), Memory::kValue);
    }
  }

  const MemoryBreakdown& live() const { return memory_.live(); }
  // The temporary memory of the operation run last, on top of live() while it runs.
  std::int64_t temporary() const { return temporary_; }

  // Runs the copy `op` at `index` (O_i, E_i, P_i): checks it, changes what it changes in
  // memory, and returns the bytes it copies (0 for E_i). `evicted` says whether an E_i follows
  // an O_i. Throws InvalidSequenceError.
  std::int64_t copy(const Op& op, std::size_t index, bool evicted) {
    op_ = &op;
    index_ = index;
    temporary_ = 0;
    const int i = op.stage;
    if (!chain_.link) reject("the chain has no link to host memory: nothing can be offloaded");
    if (i < 1 || i >= length_)
      reject(detail::str_cat("only x_1 .. x_", length_ - 1,
                             " can be copied (x_0 is the caller's, x_L the loss's)"));
    const auto ui = static_cast<std::size_t>(i);
    const std::int64_t bytes = chain_.activation_bytes(i);
    switch (op.kind) {
      case OpKind::kOffload:
        if (!value_held(ui)) reject(detail::str_cat("x_", i, " is not in memory"));
        // A copy on the host whose x_i has come back is written over: the same buffer.
        if (host_[ui] && !returned_[ui])
          reject(detail::str_cat("x_", i, " already has a copy in host memory"));
        if (!evicted)
          reject(detail::str_cat("no E_", i, " follows: an offloaded x_", i,
                                 " leaves the device at its eviction"));
        if (!host_[ui]) host_bytes_ += bytes;
        host_[ui] = evicting_[ui] = true;
        returned_[ui] = false;
        return bytes;
      case OpKind::kEvict:
        if (!evicting_[ui] || !value_held(ui))
          reject(detail::str_cat("x_", i, " is not offloaded (O_", i, " first)"));
        evicting_[ui] = false;
        drop_value(i);
        return 0;
      case OpKind::kPrefetch: {
        // (x_i is never held here: the value lifetimes drop it before anything makes it again.)
        if (evicting_[ui]) reject(detail::str_cat("x_", i, " has not been evicted (E_", i, " first)"));
        if (!host_[ui] || returned_[ui])
          reject(detail::str_cat("x_", i, " has no copy in host memory"));
        for (const Member& member : chain_.members(i)) {
          value_[ui].push_back(memory_.make(member.bytes));
          memory_.hold(value_[ui].back(), Memory::kValue);
        }
        returned_[ui] = true;
        return bytes;
      }
      default:
        break;
    }
    REMAT_INTERNAL_ASSERT(false, "operation kind ", static_cast<int>(op.kind));
  }

  // The first read of a prefetched x_i: its host copy is let go, unless x_i has been offloaded
  // again since (into the same buffer).
  void read_prefetched(int i) {
    const auto ui = static_cast<std::size_t>(i);
    if (!host_[ui] || !returned_[ui]) return;
    host_[ui] = returned_[ui] = false;
    host_bytes_ -= chain_.activation_bytes(i);
  }
  std::int64_t host_bytes() const { return host_bytes_; }

  // Runs `op`, the operation at `index` of the sequence: its time, in ms. Throws
  // InvalidSequenceError when what it needs is not held or it has already run.
  double run(const Op& op, std::size_t index) {
    op_ = &op;
    index_ = index;
    const int i = op.stage;
    if (op.kind != OpKind::kLoss && (i < 0 || i >= length_))
      reject(detail::str_cat("stage ", i, " is outside the chain's stages 0..", length_ - 1));
    const auto ui = static_cast<std::size_t>(i);
    if (op.is_forward()) {
      if (!value_held(ui)) reject(detail::str_cat("its input x_", i, " is not in memory"));
      if (backpropagated_[ui]) reject(detail::str_cat("stage ", i, " was already backpropagated"));
    }
    switch (op.kind) {
      case OpKind::kForwardGrad:
        return forward_grad(i);
      case OpKind::kForwardNoGrad:
      case OpKind::kForwardCheckpoint:
        return forward_nograd(i);
      case OpKind::kLoss:
        return loss();
      case OpKind::kBackward:
        return backward(i);
      case OpKind::kOffload:
      case OpKind::kEvict:
      case OpKind::kPrefetch:
        break;  // copy() runs these
    }
    REMAT_INTERNAL_ASSERT(false, "operation kind ", static_cast<int>(op.kind));
  }

  // What `op` frees once it is done: the values no later operation reads (keep_input and
  // keep_output from value_lifetimes), and for B_i the stage's autograd state and y_{i+1}.
  void release_after(const Op& op, bool keep_input, bool keep_output) {
    const int i = op.stage;
    const auto ui = static_cast<std::size_t>(i);
    if (op.kind == OpKind::kLoss) {
      if (!keep_input) drop_value(length_);
    } else if (op.is_copy()) {
      if (!keep_input) drop_value(i);  // E_i has dropped it already
    } else if (op.is_forward()) {
      if (!keep_input) drop_value(i);
      if (!keep_output) drop_value(i + 1);
    } else {
      for (const int id : graph_[ui]) memory_.release(id, Memory::kGraph);
      graph_[ui].clear();
      for (const int id : gradient_[ui + 1])
        if (id >= 0) memory_.release(id, Memory::kGradient);
      gradient_[ui + 1].clear();
      backpropagated_[ui] = true;
    }
  }

 private:
  [[noreturn]] void reject(const std::string& reason) const {
    throw InvalidSequenceError(index_, op_->str(), reason);
  }

  // The caller's input x_0 is held for the whole step.
  bool value_held(std::size_t k) const { return k == 0 || !value_[k].empty(); }

  void drop_value(int k) {
    const auto uk = static_cast<std::size_t>(k);
    if (k == 0) return;
    for (const int id : value_[uk]) memory_.release(id, Memory::kValue);
    value_[uk].clear();
  }

  // x_{i+1} from x_i: new storages for new members, x_i's for carried ones.
  void produce(int i) {
    const Stage& stage = chain_.stages[static_cast<std::size_t>(i)];
    std::vector<int> ids;
    for (const Member& member : stage.outputs) {
      const int id =
          member.carried()
              ? value_[static_cast<std::size_t>(i)][static_cast<std::size_t>(member.carried_from)]
              : memory_.make(member.bytes);
      memory_.hold(id, Memory::kValue);
      ids.push_back(id);
    }
    value_[static_cast<std::size_t>(i) + 1] = std::move(ids);
  }

  // Fe_i: x_{i+1}, and the autograd state (the stage's own state and what it saves).
  double forward_grad(int i) {
    const auto ui = static_cast<std::size_t>(i);
    const Stage* stage = &chain_.stages[ui];
    if (!graph_[ui].empty())
      reject(detail::str_cat("stage ", i, " already holds its autograd state"));
    produce(i);
    std::vector<int>& held = graph_[ui];
    held.push_back(memory_.make(stage->state_bytes));
    for (const int k : stage->saved_inputs)
      held.push_back(value_[ui][static_cast<std::size_t>(k)]);
    for (const int k : stage->saved_outputs)
      held.push_back(value_[ui + 1][static_cast<std::size_t>(k)]);
    for (const int id : held) memory_.hold(id, Memory::kGraph);
    temporary_ = stage->fwd_tmp_bytes;
    return stage->fwd_ms;
  }

  // Fn_i and CF_i: x_{i+1} alone.
  double forward_nograd(int i) {
    const Stage* stage = &chain_.stages[static_cast<std::size_t>(i)];
    produce(i);
    temporary_ = stage->nograd_tmp_bytes();
    return time_.use_nograd_time ? stage->nograd_ms() : stage->fwd_ms;
  }

  // The loss: y_L from x_L, in no time of its own (its time is the last stage's).
  double loss() {
    const auto ul = static_cast<std::size_t>(length_);
    if (!value_held(ul)) reject(detail::str_cat("the output x_", length_, " is not in memory"));
    if (!gradient_[ul].empty() || backpropagated_[ul - 1]) reject("the loss was already computed");
    // y_L: a gradient for each member the loss differentiates (Member::loss_gradient).
    for (const Member& member : chain_.members(length_)) {
      const bool differentiated = member.grad && member.loss_gradient;
      gradient_[ul].push_back(differentiated ? memory_.make(member.gradient_size()) : -1);
      if (differentiated) memory_.hold(gradient_[ul].back(), Memory::kGradient);
    }
    temporary_ = chain_.loss_tmp_bytes;
    // The caller keeps the x_L it was handed until the step ends (Chain::output_held):
    // its storages stay, whatever the runtime drops, and a recomputed x_L is another copy.
    if (chain_.output_held)
      for (const int id : value_[ul]) memory_.hold(id, Memory::kValue);
    return 0;
  }

  // B_i: y_i from y_{i+1} and the stage's autograd state.
  double backward(int i) {
    const auto ui = static_cast<std::size_t>(i);
    const Stage* stage = &chain_.stages[ui];
    if (backpropagated_[ui]) reject(detail::str_cat("gradient y_", i, " computed twice"));
    if (gradient_[ui + 1].empty())
      reject(detail::str_cat("gradient y_", i + 1, " is not in memory"));
    if (graph_[ui].empty())
      reject(detail::str_cat("stage ", i, " holds no autograd state (run Fe_", i, " first)"));
    // y_i: a carried member's gradient is the one y_{i+1} holds for it, passed on (the
    // stage adds its own contribution into it, in place); the others are new.
    const std::vector<Member>& input = chain_.members(i);
    std::vector<int> ids(input.size(), -1);
    for (std::size_t o = 0; o < stage->outputs.size(); ++o) {
      const Member& member = stage->outputs[o];
      // -1 where y_{i+1} holds none (a member of x_L the loss does not differentiate): the
      // stage's own contribution, if any, is then a new gradient.
      if (member.carried() && member.grad && gradient_[ui + 1][o] >= 0)
        ids[static_cast<std::size_t>(member.carried_from)] = gradient_[ui + 1][o];
    }
    for (std::size_t k = 0; k < input.size(); ++k) {
      if (!input[k].grad) continue;
      if (ids[k] < 0) ids[k] = memory_.make(input[k].gradient_size());
      memory_.hold(ids[k], Memory::kGradient);
    }
    gradient_[ui] = std::move(ids);
    temporary_ = stage->bwd_tmp_bytes;
    return stage->bwd_ms;
  }

  const Chain& chain_;
  const int length_;
  const TimeModel time_;
  Memory memory_;
  // value_[k]: the storages of the held x_k, one per member (empty: not held).
  // graph_[i]: the storages stage i's autograd state holds (its state first; empty: none).
  // gradient_[k]: the storages of y_k, one per member, -1 for members without a gradient
  // (empty: y_k not held).
  std::vector<std::vector<int>> value_, graph_, gradient_;
  std::vector<bool> backpropagated_;
  // host_[k]: x_k has a copy in host memory (from O_k until the prefetched x_k is read);
  // returned_[k]: it has been prefetched (P_k) since; evicting_[k]: O_k ran, its E_k not yet.
  std::vector<bool> host_, returned_, evicting_;
  std::int64_t host_bytes_ = 0;
  std::int64_t temporary_ = 0;
  const Op* op_ = nullptr;
  std::size_t index_ = 0;
};

constexpr std::size_t kNever = std::numeric_limits<std::size_t>::max();

}  // namespace

ValueLifetimes value_lifetimes(const Sequence& sequence, int length) {
  const std::size_t n = sequence.size();
  ValueLifetimes out{std::vector<bool>(n, false), std::vector<bool>(n, false)};
  std::vector<std::size_t> next_read(static_cast<std::size_t>(length) + 2, kNever);
  std::vector<std::size_t> next_produce(static_cast<std::size_t>(length) + 2, kNever);
  auto needed = [&](int k) {
    if (k < 0 || k > length + 1) return false;
    const auto uk = static_cast<std::size_t>(k);
    return next_read[uk] != kNever && next_read[uk] < next_produce[uk];
  };
  for (std::size_t p = n; p-- > 0;) {
    const Op& op = sequence[p];
    if (op.kind == OpKind::kLoss) {
      out.keep_input[p] = needed(length);
      next_read[static_cast<std::size_t>(length)] = p;
    } else if (op.is_copy() && op.stage >= 0 && op.stage <= length) {
      out.keep_input[p] = needed(op.stage);
      if (op.kind == OpKind::kPrefetch)
        next_produce[static_cast<std::size_t>(op.stage)] = p;
      else
        next_read[static_cast<std::size_t>(op.stage)] = p;
    } else if (op.is_forward() && op.stage >= 0 && op.stage < length) {
      out.keep_input[p] = needed(op.stage);
      out.keep_output[p] = needed(op.stage + 1);
      next_read[static_cast<std::size_t>(op.stage)] = p;
      next_produce[static_cast<std::size_t>(op.stage) + 1] = p;
    }
  }
  return out;
}

// The copies of docs/cost-model.md, "Offload", in time: one engine per direction runs its
// copies one at a time, in the sequence's order. A copy starts when its engine is free and the
// compute operation after it in the sequence starts: a copy back when that operation could
// start (after its restart, before any wait: it may be waiting for this very copy), a copy out
// once it does (after its waits), and not before x_i is back on the device where it was
// prefetched.
class CopyEngines {
 public:
  explicit CopyEngines(const Chain& chain) : chain_(chain) {}

  // Copy `op` of `bytes`, the operation at `record` of the trace, waits for the next compute
  // operation.
  void issue(const Op& op, std::int64_t bytes, std::size_t record) {
    if (op.kind == OpKind::kEvict) return;
    pending_.push_back({op, bytes, record});
  }
  // The compute operation after the pending copies: the copies back start at `could_begin`,
  // the copies out at `begins`.
  void start_pending(OpKind kind, double begin, std::vector<OpRecord>& trace) {
    std::vector<Pending> left;
    for (const Pending& p : pending_) {
      if (p.op.kind != kind) {
        left.push_back(p);
        continue;
      }
      const bool out = kind == OpKind::kOffload;
      double& free = out ? d2h_free_ : h2d_free_;
      double start = std::max(begin, free);
      if (out) start = std::max(start, prefetch_end(p.op.stage));
      free = start + (out ? chain_.link->d2h_ms(p.bytes) : chain_.link->h2d_ms(p.bytes));
      trace[p.record].start_ms = start;
      trace[p.record].end_ms = free;
      (out ? offload_end_ : prefetch_end_)[p.op.stage] = free;
      last_end_ = std::max(last_end_, free);
    }
    pending_ = std::move(left);
  }
  // When x_i's copy to host memory ends; negative where it has not started.
  double offload_end(int i) const { return find(offload_end_, i); }
  void forget_offload(int i) { offload_end_.erase(i); }
  // When x_i's copy back ends; negative where none is pending.
  double prefetch_end(int i) const { return find(prefetch_end_, i); }
  // The first read of a prefetched x_i: when it may start (then the copy is forgotten).
  double take_prefetch(int i) {
    const double end = find(prefetch_end_, i);
    prefetch_end_.erase(i);
    return end;
  }
  double last_end() const { return last_end_; }

 private:
  struct Pending {
    Op op;
    std::int64_t bytes;
    std::size_t record;
  };
  static double find(const std::map<int, double>& ends, int i) {
    const auto it = ends.find(i);
    return it == ends.end() ? -1.0 : it->second;
  }
  const Chain& chain_;
  std::vector<Pending> pending_;
  std::map<int, double> offload_end_, prefetch_end_;
  double d2h_free_ = 0, h2d_free_ = 0, last_end_ = 0;
};

// evicted[p]: operation p is an O_i that an E_i follows before the next O_i.
std::vector<bool> evictions(const Sequence& sequence) {
  std::vector<bool> out(sequence.size(), false);
  std::map<int, bool> seen;  // an E_i after the position being scanned, before the next O_i
  for (std::size_t p = sequence.size(); p-- > 0;) {
    const Op& op = sequence[p];
    if (op.kind == OpKind::kEvict) seen[op.stage] = true;
    if (op.kind == OpKind::kOffload) {
      out[p] = seen[op.stage];
      seen[op.stage] = false;
    }
  }
  return out;
}

Simulation simulate(const Chain& chain, const Sequence& sequence, TimeModel time) {
  REMAT_CHECK(chain.length() > 0, "cannot simulate an empty chain");
  Step step(chain, time);
  CopyEngines engines(chain);
  const ValueLifetimes live_after = value_lifetimes(sequence, chain.length());
  const std::vector<bool> evicted = evictions(sequence);
  Simulation sim;
  sim.peak_bytes = sim.initial_bytes = step.live().total();
  sim.trace.reserve(sequence.size());
  double now = 0;  // when the compute stream is free
  const Op* last_compute = nullptr;
  for (std::size_t index = 0; index < sequence.size(); ++index) {
    const Op& op = sequence[index];
    if (index > 0 && sequence[index - 1] == bwd(0))
      throw InvalidSequenceError(index, op.str(), "operations after B_0");
    OpRecord record;
    record.op = op;
    if (op.is_copy()) {
      const std::int64_t bytes = step.copy(op, index, evicted[index]);
      record.during = step.live();
      if (op.kind == OpKind::kEvict) {
        const double end = engines.offload_end(op.stage);
        if (end < 0)
          throw InvalidSequenceError(index, op.str(),
                                     detail::str_cat("the copy of x_", op.stage,
                                                     " to host memory has not started: a compute "
                                                     "operation must run between O_",
                                                     op.stage, " and E_", op.stage));
        engines.forget_offload(op.stage);
        if (end > now) {
          sim.copy_wait_ms += end - now;
          now = end;
        }
        record.start_ms = record.end_ms = now;
      }
      if (op.kind == OpKind::kOffload) ++sim.offloads;
      step.release_after(op, live_after.keep_input[index], false);
      record.live_after_bytes = step.live().total();
      sim.host_peak_bytes = std::max(sim.host_peak_bytes, step.host_bytes());
      engines.issue(op, bytes, sim.trace.size());
    } else {
      const double cost = step.run(op, index);
      record.during = step.live();
      record.during.temporary_bytes = step.temporary();
      step.release_after(op, live_after.keep_input[index], live_after.keep_output[index]);
      if (op.kind == OpKind::kForwardGrad) ++sim.grad_forwards;
      if (op.kind == OpKind::kForwardNoGrad || op.kind == OpKind::kForwardCheckpoint)
        ++sim.nograd_forwards;
      record.start_ms = now;
      // A forward right after a backward restarts (docs/cost-model.md, "The time model").
      double begin = now;
      if (op.is_forward() && last_compute != nullptr && last_compute->kind == OpKind::kBackward) {
        begin += chain.restart_ms;
        ++sim.restarts;
      }
      engines.start_pending(OpKind::kPrefetch, begin, sim.trace);
      // A read of a prefetched x_k waits for its copy; then its host copy is let go.
      if (op.kind != OpKind::kBackward) {
        const int input = op.kind == OpKind::kLoss ? chain.length() : op.stage;
        const double end = engines.take_prefetch(input);
        if (end > begin) {
          sim.copy_wait_ms += end - begin;
          begin = end;
        }
        if (end >= 0) step.read_prefetched(input);
      }
      engines.start_pending(OpKind::kOffload, begin, sim.trace);
      now = begin + cost;
      record.end_ms = now;
      record.live_after_bytes = step.live().total();
      last_compute = &op;
    }
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
  sim.makespan_ms = std::max(now, engines.last_end());
  return sim;
}

}  // namespace remat
