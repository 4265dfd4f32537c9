#include "remat/solver/simulator.h"

#include <limits>

#include "remat/solver/check.h"

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
    } else if (op.is_forward() && op.stage >= 0 && op.stage < length) {
      out.keep_input[p] = needed(op.stage);
      out.keep_output[p] = needed(op.stage + 1);
      next_read[static_cast<std::size_t>(op.stage)] = p;
      next_produce[static_cast<std::size_t>(op.stage) + 1] = p;
    }
  }
  return out;
}

Simulation simulate(const Chain& chain, const Sequence& sequence, TimeModel time) {
  const int length = chain.length();
  REMAT_CHECK(length > 0, "cannot simulate an empty chain");
  const auto boundaries = static_cast<std::size_t>(length) + 1;
  Memory memory;
  memory.add_fixed(chain.context_bytes);
  // value[k]: the storages of the held x_k, one per member (empty: not held).
  // graph[i]: the storages stage i's autograd state holds (its state first; empty: no state).
  // gradient[k]: the storages of y_k, one per member, -1 for members without a gradient
  // (empty: y_k not held).
  std::vector<std::vector<int>> value(boundaries), graph(boundaries - 1), gradient(boundaries);
  std::vector<bool> backpropagated(boundaries - 1, false);
  for (const Member& member : chain.inputs) {
    value[0].push_back(memory.make(member.bytes));
    memory.hold(value[0].back(), Memory::kValue);
  }
  // The caller's input x_0 is held for the whole step.
  auto value_held = [&](std::size_t k) { return k == 0 || !value[k].empty(); };
  auto drop_value = [&](int k) {
    const auto uk = static_cast<std::size_t>(k);
    if (k == 0) return;
    for (const int id : value[uk]) memory.release(id, Memory::kValue);
    value[uk].clear();
  };
  // x_{i+1} from x_i: new storages for new members, x_i's for carried ones.
  auto produce = [&](int i) {
    const Stage& stage = chain.stages[static_cast<std::size_t>(i)];
    std::vector<int> ids;
    for (const Member& member : stage.outputs) {
      const int id =
          member.carried()
              ? value[static_cast<std::size_t>(i)][static_cast<std::size_t>(member.carried_from)]
              : memory.make(member.bytes);
      memory.hold(id, Memory::kValue);
      ids.push_back(id);
    }
    value[static_cast<std::size_t>(i) + 1] = std::move(ids);
  };

  const ValueLifetimes live_after = value_lifetimes(sequence, length);
  Simulation sim;
  sim.peak_bytes = memory.live().total();
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
    const auto ui = static_cast<std::size_t>(i);
    if (op.is_forward()) {
      if (!value_held(ui)) reject(detail::str_cat("its input x_", i, " is not in memory"));
      if (backpropagated[ui]) reject(detail::str_cat("stage ", i, " was already backpropagated"));
    }

    OpRecord record;
    record.op = op;
    double cost = 0;
    std::int64_t temporary = 0;
    const Stage* stage = op.kind == OpKind::kLoss ? nullptr : &chain.stages[ui];
    switch (op.kind) {
      case OpKind::kForwardGrad: {
        if (!graph[ui].empty())
          reject(detail::str_cat("stage ", i, " already holds its autograd state"));
        produce(i);
        std::vector<int>& held = graph[ui];
        held.push_back(memory.make(stage->state_bytes));
        for (const int k : stage->saved_inputs)
          held.push_back(value[ui][static_cast<std::size_t>(k)]);
        for (const int k : stage->saved_outputs)
          held.push_back(value[ui + 1][static_cast<std::size_t>(k)]);
        for (const int id : held) memory.hold(id, Memory::kGraph);
        cost = stage->fwd_ms;
        temporary = stage->fwd_tmp_bytes;
        ++sim.grad_forwards;
        break;
      }
      case OpKind::kForwardNoGrad:
      case OpKind::kForwardCheckpoint:
        produce(i);
        cost = time.use_nograd_time ? stage->nograd_ms() : stage->fwd_ms;
        temporary = stage->nograd_tmp_bytes();
        ++sim.nograd_forwards;
        break;
      case OpKind::kLoss: {
        const auto ul = static_cast<std::size_t>(length);
        if (!value_held(ul)) reject(detail::str_cat("the output x_", length, " is not in memory"));
        if (!gradient[ul].empty() || backpropagated[ul - 1])
          reject("the loss was already computed");
        for (const Member& member : chain.members(length)) {
          gradient[ul].push_back(member.grad ? memory.make(member.gradient_size()) : -1);
          if (member.grad) memory.hold(gradient[ul].back(), Memory::kGradient);
        }
        temporary = chain.loss_tmp_bytes;
        // The caller keeps the x_L it was handed until the step ends (Chain::output_held):
        // its storages stay, whatever the runtime drops, and a recomputed x_L is another copy.
        if (chain.output_held)
          for (const int id : value[ul]) memory.hold(id, Memory::kValue);
        break;
      }
      case OpKind::kBackward: {
        if (backpropagated[ui]) reject(detail::str_cat("gradient y_", i, " computed twice"));
        if (gradient[ui + 1].empty())
          reject(detail::str_cat("gradient y_", i + 1, " is not in memory"));
        if (graph[ui].empty())
          reject(detail::str_cat("stage ", i, " holds no autograd state (run Fe_", i, " first)"));
        // y_i: a carried member's gradient is the one y_{i+1} holds for it, passed on (the
        // stage adds its own contribution into it, in place); the others are new.
        const std::vector<Member>& input = chain.members(i);
        std::vector<int> ids(input.size(), -1);
        for (std::size_t o = 0; o < stage->outputs.size(); ++o) {
          const Member& member = stage->outputs[o];
          if (member.carried() && member.grad)
            ids[static_cast<std::size_t>(member.carried_from)] = gradient[ui + 1][o];
        }
        for (std::size_t k = 0; k < input.size(); ++k) {
          if (!input[k].grad) continue;
          if (ids[k] < 0) ids[k] = memory.make(input[k].gradient_size());
          memory.hold(ids[k], Memory::kGradient);
        }
        gradient[ui] = std::move(ids);
        cost = stage->bwd_ms;
        temporary = stage->bwd_tmp_bytes;
        break;
      }
    }
    record.during = memory.live();
    record.during.temporary_bytes = temporary;
    // What the operation frees once it is done: values no later operation reads, and for B_i
    // the stage's autograd state and y_{i+1}.
    if (op.kind == OpKind::kLoss) {
      if (!live_after.keep_input[index]) drop_value(length);
    } else if (op.is_forward()) {
      if (!live_after.keep_input[index]) drop_value(i);
      if (!live_after.keep_output[index]) drop_value(i + 1);
    } else {
      for (const int id : graph[ui]) memory.release(id, Memory::kGraph);
      graph[ui].clear();
      for (const int id : gradient[ui + 1])
        if (id >= 0) memory.release(id, Memory::kGradient);
      gradient[ui + 1].clear();
      backpropagated[ui] = true;
    }
    if (op.is_forward() && index > 0 && sequence[index - 1].kind == OpKind::kBackward) {
      cost += chain.restart_ms;  // a restart (docs/cost-model.md, "The time model")
      ++sim.restarts;
    }
    record.start_ms = now;
    now += cost;
    record.end_ms = now;
    record.live_after_bytes = memory.live().total();
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
