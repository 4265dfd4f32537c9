#pragma once
/// Schedules as sequences of operations, named as the reference rotor implementation names
/// them: `Fe_i`, `Fn_i`, `CF_i`, `L`, `B_i`; and the copies of an activation to host memory and
/// back: `O_i`, `E_i`, `P_i` (docs/cost-model.md, "Offload").

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace remat {

/// The kind of one operation of a schedule.
enum class OpKind : std::uint8_t {
  /// `Fe_i`: forward of stage i with autograd, keeping what its backward needs.
  kForwardGrad,
  /// `Fn_i`: forward without autograd; its input is freed unless it is a checkpoint.
  kForwardNoGrad,
  /// `CF_i`: forward without autograd that keeps its input x_i as a checkpoint.
  kForwardCheckpoint,
  /// `L`: the loss and its gradient y_L.
  kLoss,
  /// `B_i`: backward of stage i, from y_{i+1} to y_i.
  kBackward,
  /// `O_i`: offload x_i: start copying it to host memory (its device storages stay).
  kOffload,
  /// `E_i`: evict x_i: wait for its copy to host memory, then free its device storages.
  kEvict,
  /// `P_i`: prefetch x_i: allocate it on the device again and start copying it back; the first
  /// operation that reads it waits for the copy.
  kPrefetch,
};

/// Whether an operation of this kind is a copy between the device and host memory (`O`, `E`,
/// `P`), which the compute stream does not run.
inline bool is_copy(OpKind kind) {
  return kind == OpKind::kOffload || kind == OpKind::kEvict || kind == OpKind::kPrefetch;
}

/// One operation: a kind and the stage it applies to (the chain length L for `L`).
struct Op {
  OpKind kind = OpKind::kForwardGrad;
  int stage = 0;

  /// `Fe_3`, `Fn_4`, `CF_0`, `L`, `B_2`.
  std::string str() const;
  bool is_forward() const {
    return kind == OpKind::kForwardGrad || kind == OpKind::kForwardNoGrad ||
           kind == OpKind::kForwardCheckpoint;
  }
  /// `O_i`, `E_i`, `P_i`.
  bool is_copy() const { return remat::is_copy(kind); }
  friend bool operator==(const Op& a, const Op& b) {
    return a.kind == b.kind && (a.stage == b.stage || a.kind == OpKind::kLoss);
  }
  friend bool operator!=(const Op& a, const Op& b) { return !(a == b); }
};

/// A schedule: operations in execution order.
using Sequence = std::vector<Op>;

/// Shorthands. Example: `Sequence s{fe(0), loss(1), bwd(0)};`
inline Op fe(int i) { return {OpKind::kForwardGrad, i}; }
inline Op fn(int i) { return {OpKind::kForwardNoGrad, i}; }
inline Op cf(int i) { return {OpKind::kForwardCheckpoint, i}; }
inline Op loss(int length) { return {OpKind::kLoss, length}; }
inline Op bwd(int i) { return {OpKind::kBackward, i}; }
inline Op offload(int i) { return {OpKind::kOffload, i}; }
inline Op evict(int i) { return {OpKind::kEvict, i}; }
inline Op prefetch(int i) { return {OpKind::kPrefetch, i}; }

/// Parses one operation (`Fe_3`, `L`, `O_2`, ...). Throws std::invalid_argument.
Op parse_op(std::string_view text);

/// The sequence with runs collapsed: consecutive forwards of one kind over increasing stages
/// and backwards over decreasing stages, e.g. `CF_0 Fn_1..5 Fe_6..9 L B_9..6`.
std::string collapsed_string(const Sequence& sequence);

/// One string per operation, e.g. {"CF_0", "Fn_1", ..., "B_0"}.
std::vector<std::string> op_strings(const Sequence& sequence);

/// Parses a sequence written with spaces or commas between operations, collapsed runs
/// allowed (`CF_0 Fn_1..5 L B_5..0`). The loss may be written `L` (its stage is set to
/// `length`). Throws std::invalid_argument naming the token.
Sequence parse_sequence(std::string_view text, int length);

}  // namespace remat
