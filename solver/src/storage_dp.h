#pragma once
// The dynamic program over storages (storage_dp.cpp): rotor's nested recurrence with every
// storage counted once, exact where a chain carries members (docs/algorithms.md, "The
// storage-exact dynamic program").

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "remat/solver/chain.h"
#include "remat/solver/sequence.h"
#include "remat/solver/solver.h"
#include "relax.h"

namespace remat {
namespace detail {

// The most candidate evaluations a storage-exact table may take in solve(), as estimated before
// it is computed (an upper bound: pruning skips most). At the allowance, about 2 s on one core of
// the development machine (torchvision's resnet152 by convolution unit, 153 stages, 2,496
// slots: 4.0 x 10^9 estimated; docs/algorithms.md).
inline constexpr double kStorageDpWork = 4e9;

// A segment (i, l) with the set Z of x_i's storages held outside it for its whole run (by an
// enclosing segment's start, a stage's autograd state, the caller's x_0 or x_L): the segment
// counts the rest. Z replaces the persistent table's fresh/taped state (a taped start is one
// whose previous stage's kept outputs are in Z).
class StorageDp {
 public:
  // The table for memories 0..capacity units (of `unit_bytes`, the context and x_0 included),
  // or none where it would take more than `max_cells` stored values or `max_work` candidate
  // evaluations.
  // Its rows are computed by `threads` workers (0: one per available core, or the calling thread
  // alone for small tables), shortest segments first; the values do not depend on the count.
  static std::unique_ptr<StorageDp> build(const Chain& chain, std::int64_t unit_bytes,
                                          std::int64_t capacity_units, bool use_nograd_time,
                                          std::int64_t max_cells, double max_work,
                                          int threads = 0);
  // The least budget in bytes of a nested sequence: exact (unit 1, no memory axis).
  static std::int64_t least_bytes(const Chain& chain);
  // A nested sequence that peaks at least_bytes(chain).
  static Sequence least_sequence(const Chain& chain);

  // The optimum within `bytes` (at most the capacity), +inf where none fits, and its sequence
  // (empty where none fits).
  double value_at(std::int64_t bytes) const;
  Sequence sequence_at(std::int64_t bytes) const;

  struct Model;  // the chain's storages (storage_dp.cpp)
  ~StorageDp();

 private:
  StorageDp(const Chain& chain, std::int64_t unit_bytes, bool use_nograd_time);
  struct Choice;
  // What a leaf j of a segment starting at i needs whatever the segment's end and Z: its
  // forwards' memory beyond x_i and y_{l+1}, its time (forwards and restart), its right part's Z.
  struct LeafPart {
    std::int64_t forwards = 0;
    double time = 0;
    int right_z = 0;
  };
  const std::vector<LeafPart>& leaf_parts(int i) const;
  int state(int i, const std::vector<int>& held) const;  // interns Z for start i
  // What the choices of Opt(i, l, Z) share, worked out once: its leaves differ only by their
  // LeafPart. The chain step (the loss where i is L) is `step`.
  struct Frame;
  Frame frame(int i, int l, int z) const;
  // What a frame of start i and Z shares whatever the segment's end (but the chain's last,
  // after the loss where x_L is held): worked out once per state, as least() asks for every
  // end of each.
  struct StartFrame {
    bool ready = false;
    std::int64_t own = 0;           // x_i's storages outside Z
    std::int64_t forward_base = 0;  // the chain step's forward but y_{l+1}
    std::int64_t backward = 0;      // the chain step's backward
    int first_z = 0;                // the chain step's rest: its Z and shift
    std::int64_t first_shift = 0;
  };
  const StartFrame& start_frame(int i, int z) const;
  static Choice leaf(const Frame& f, const LeafPart& part, int j);
  // Every choice: the leaves j = i+1..l, then the chain step (the loss alone where i is L).
  std::vector<Choice> choices(int i, int l, int z) const;
  std::int64_t least(int i, int l, int z);
  // Marks the rows Opt(i, l, z) needs (the reachable ones whose least memory is in the table),
  // by segment length, counting their work; then computes a marked row from the shorter ones,
  // in `scratch` (width_ values).
  struct Key {
    int i, l, z;
  };
  // The marked rows by segment length, and their cells and work so far against the allowance.
  struct Marking {
    std::vector<std::vector<Key>> by_length;
    double cells = 0, work = 0, max_cells = 0, max_work = 0;
  };
  // False, as soon as the marked rows' cells or work exceed the allowance.
  bool mark(int i, int l, int z, Marking& marking);
  void compute_row(const Key& key, double* scratch);
  std::int64_t root_memory(std::int64_t bytes) const;
  // Bytes in units, rounded up.
  std::int64_t units(std::int64_t bytes) const;
  void rebuild(int i, int l, int z, std::int64_t m, Sequence& out) const;
  void rebuild_least(int i, int l, int z, Sequence& out);

  std::unique_ptr<Model> model_;
  std::int64_t unit_ = 1;
  std::int64_t width_ = 0;  // memories 0..width_-1
  int root_z_ = 0;
  // Once the rows are marked every state is interned: state() only looks up (and the workers
  // computing rows may call it concurrently).
  bool frozen_ = false;
  // Z of each start, interned; rows and least memories keyed by (i, l, z).
  mutable std::vector<std::map<std::vector<int>, int>> states_;
  mutable std::vector<std::vector<std::vector<int>>> state_sets_;
  // Least memories, [i][z][l - i] (-1: not yet worked out): a start's segments side by side.
  mutable std::vector<std::vector<std::vector<std::int64_t>>> least_;
  // Whether mark() reached a row, [i][z][l - i] likewise.
  mutable std::vector<std::vector<std::vector<char>>> marked_;
  // [i][z], filled as asked for, and for every marked row's state before the rows are
  // computed (the workers only read them).
  mutable std::vector<std::vector<StartFrame>> start_frames_;
  mutable std::vector<std::vector<LeafPart>> leaf_parts_;
  struct Entry {
    std::unique_ptr<double[]> values;
    RowView row;  // over `values`; empty when +inf everywhere in the table (or not computed)
  };
  // The entry of a marked row, once build() has made room for it.
  Entry& entry(int i, int l, int z);
  // The row of a marked entry (an empty one otherwise).
  const RowView& find_row(int i, int l, int z) const;
  // [i][z][l - i], as least_: a leaf's left parts (i, j - 1, z) side by side. A state whose
  // rows none is marked has no list.
  std::vector<std::vector<std::vector<Entry>>> entries_;
};

// Whether solve(), tradeoff() and min_feasible_budget() solve the storage-exact table for this
// chain: it carries members, and has at most kStorageDpMaxStages stages.
inline bool storage_dp_applies(const Chain& chain) {
  return chain.carried_bytes() > 0 && chain.length() <= kStorageDpMaxStages;
}

// The storage-exact table solve() and tradeoff() use for `budget` (discretize_filled's capacity
// when `filled`, else discretize's): automatic slots, halved until its work and memory fit
// (kStorageDpWork; half the memory limit), down to 500; none if they never do. `threads` as
// SolveOptions::threads (StorageDp::build).
struct StorageTable {
  std::unique_ptr<StorageDp> table;
  Discretization discretization;
};
StorageTable storage_table(const Chain& chain, std::int64_t budget, bool filled,
                           bool use_nograd_time, std::int64_t memory_limit_bytes, int threads);

}  // namespace detail
}  // namespace remat
