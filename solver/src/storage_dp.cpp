// The storage-exact dynamic program (docs/algorithms.md, "The storage-exact dynamic program").
//
// Rotor's nested recurrence, with sets of storages where the persistent table (persistent_dp.cpp)
// has sizes. A segment (i, l, Z) reverses stages i..l from x_i, given y_{l+1}, while the
// storages Z of x_i are held outside it for its whole run; its memory m counts everything else
// it holds (x_i's other storages, y_{l+1}, what it makes). With X_k the storages of x_k,
// R_i = the storages stage i keeps of x_i and x_{i+1}, s_i its state, n(k) = X_{k+1} \ X_k
// what stage k makes, and |S| the bytes of a set:
//
//   Opt(L, L, Z)   the loss:  m >= |X_L \ Z| + g[L] + bt[L]
//   Opt(i, i, Z)   Fe_i B_i:  m >= max(fwd(i, i), bwd(i, i))
//   Opt(i, l, Z) = the least of
//     leaf j, i < j <= l:  (nf[i] + .. + nf[j-1] + restart_after(j))
//                            + Opt(j, l, X_i n X_j)[m - |X_i \ Z|]
//                            + Opt(i, j-1, Z')[m - t]
//                          if m >= |X_i \ Z| + g[l+1] + max_{i<=k<j} (|X_k \ X_i| + |n(k)| + nt[k])
//                          (after the loss, l = L with the caller keeping x_L: Z' = Z u (X_i n
//                          X_L), t = |X_L \ Z|; else Z' = Z, t = 0)
//     chain step:          (fw[i] + bw[i]) + Opt(i+1, l, X_{i+1} n (Z u R_i))[m - |R_i \ Z| - s_i]
//                          if m >= max(fwd(i, l), bwd(i, l))
//   fwd(i, l) = |X_i \ Z| + g[l+1] + |n(i)| + s_i + ft[i]
//   bwd(i, l) = |(R_i u T) \ Z| + s_i + (g[i+1] + g[i] - gradients passed on in place) + bt[i]
//               (T = X_L for l = L with the caller keeping x_L, else none)
//
// The root is Opt(0, L, X_0)[M - context - |X_0|]: the caller holds x_0. A taped start (x_i from
// Fe_{i-1}) is one whose Z holds stage i-1's kept outputs, put there by the chain step, so the
// two states of the persistent table are two values of Z. Every storage is counted once: a
// member carried from x_i into x_j is x_i's storage, in Z for the segment that starts at x_j.
// Rows are computed on demand from the root, so only the reachable (i, l, Z) are. Sizes are in
// units, each set's bytes rounded up: exact in units of one byte, conservative otherwise.
#include "storage_dp.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "discretization.h"
#include "nested_form.h"
#include "remat/base/check.h"
#include "unit_chain.h"
#include "worker_pool.h"

namespace remat {
namespace detail {

struct StorageDp::Model {
  int length = 0;
  std::vector<std::int64_t> bytes;          // of each storage
  std::vector<std::vector<int>> x;          // X_k, sorted, 0..L
  std::vector<std::vector<int>> kept;       // R_i, sorted, 0..L-1
  std::vector<std::int64_t> state, ft, nt, bt;  // bt[L]: the loss's temporary
  std::vector<std::int64_t> grad;           // g[k], 0..L+1
  std::vector<std::int64_t> passed;         // bytes of y_i passed on from y_{i+1} in place
  std::vector<double> fw, bw, nf;
  double restart = 0;
  std::int64_t context = 0;
  bool output_held = true;

  explicit Model(const Chain& chain, bool use_nograd_time) {
    length = chain.length();
    const auto n = static_cast<std::size_t>(length);
    const Chain::Storages storages = chain.storages();
    const std::vector<std::vector<int>>& ids = storages.ids;  // the storage of each member of x_k
    for (const Member& maker : storages.makers) bytes.push_back(maker.bytes);
    const auto sorted = [](std::vector<int> v) {
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
      return v;
    };
    for (std::size_t k = 0; k <= n; ++k) x.push_back(sorted(ids[k]));
    grad.assign(n + 2, 0);
    for (int k = 0; k <= length; ++k) grad[static_cast<std::size_t>(k)] = chain.gradient_bytes(k);
    state.assign(n + 1, 0);
    ft.assign(n + 1, 0);
    nt.assign(n + 1, 0);
    bt.assign(n + 1, 0);
    fw.assign(n + 1, 0.0);
    bw.assign(n + 1, 0.0);
    nf.assign(n + 1, 0.0);
    passed.assign(n + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      const Stage& stage = chain.stages[i];
      std::vector<int> r;
      for (const int k : stage.saved_inputs) r.push_back(ids[i][static_cast<std::size_t>(k)]);
      for (const int k : stage.saved_outputs) r.push_back(ids[i + 1][static_cast<std::size_t>(k)]);
      kept.push_back(sorted(r));
      state[i] = stage.state_bytes;
      ft[i] = stage.fwd_tmp_bytes;
      nt[i] = stage.nograd_tmp_bytes();
      bt[i] = stage.bwd_tmp_bytes;
      fw[i] = stage.fwd_ms;
      bw[i] = stage.bwd_ms;
      nf[i] = use_nograd_time ? stage.nograd_ms() : stage.fwd_ms;
      const std::vector<Member>& input = chain.members(static_cast<int>(i));
      std::vector<bool> receives(input.size(), false);
      for (const Member& member : stage.outputs)
        if (member.carried() && member.grad && member.loss_gradient)
          receives[static_cast<std::size_t>(member.carried_from)] = true;
      for (std::size_t k = 0; k < input.size(); ++k)
        if (receives[k]) passed[i] += input[k].gradient_size();
    }
    bt[n] = chain.loss_tmp_bytes;
    restart = chain.restart_ms;
    context = chain.context_bytes;
    output_held = chain.output_held;
  }

  // |a \ z|
  std::int64_t minus(const std::vector<int>& a, const std::vector<int>& z) const {
    std::int64_t total = 0;
    auto it = z.begin();
    for (const int id : a) {
      while (it != z.end() && *it < id) ++it;
      if (it == z.end() || *it != id) total += bytes[static_cast<std::size_t>(id)];
    }
    return total;
  }
  static std::vector<int> meet(const std::vector<int>& a, const std::vector<int>& b) {
    std::vector<int> out;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
    return out;
  }
  static std::vector<int> join(const std::vector<int>& a, const std::vector<int>& b) {
    std::vector<int> out;
    std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
    return out;
  }
  double restart_after(int j) const { return j < length ? restart : 0.0; }
  // The gradients live during B_i: y_{i+1}'s and y_i's, less what is passed on in place.
  std::int64_t backward_gradients(std::size_t i) const { return grad[i + 1] + grad[i] - passed[i]; }
};

// One choice of a segment (i, l, z): leaf j (j > 0) or the chain step (j = 0). Its own
// operations need `need` units; it runs `first` at m - first_shift (a leaf's right part
// (j, l, first_z), the chain step's rest (i+1, l, first_z)) and, for a leaf, its left part
// (i, j-1, second_z) at m - second_shift.
struct StorageDp::Choice {
  int j = 0;
  std::int64_t need = 0;
  double time = 0;
  int first_z = 0;
  std::int64_t first_shift = 0;
  int second_z = 0;
  std::int64_t second_shift = 0;
};

struct StorageDp::Frame {
  std::int64_t leaf_base = 0;   // a leaf needs leaf_base + its forwards' memory
  std::int64_t own = 0;         // a leaf's right part's shift: x_i's storages outside Z
  int left_z = 0;               // a leaf's left part's Z and shift
  std::int64_t left_shift = 0;
  Choice step;
};

StorageDp::StorageDp(const Chain& chain, std::int64_t unit_bytes, bool use_nograd_time)
    : model_(std::make_unique<Model>(chain, use_nograd_time)), unit_(unit_bytes) {
  states_.resize(static_cast<std::size_t>(model_->length) + 1);
  leaf_parts_.resize(states_.size());
  entries_.resize(states_.size());
  state_sets_.resize(states_.size());
  least_.resize(states_.size());
  marked_.resize(states_.size());
  start_frames_.resize(states_.size());
  root_z_ = state(0, model_->x[0]);
}

StorageDp::~StorageDp() = default;

std::int64_t StorageDp::units(std::int64_t bytes) const {
  return bytes / unit_ + (bytes % unit_ != 0 ? 1 : 0);
}

int StorageDp::state(int i, const std::vector<int>& held) const {
  auto& map = states_[static_cast<std::size_t>(i)];
  const auto found = map.find(held);
  if (found != map.end()) return found->second;
  REMAT_INTERNAL_ASSERT(!frozen_, "storage table: a state of start ", i, " not interned");
  const int id = static_cast<int>(map.size());
  map.emplace(held, id);
  state_sets_[static_cast<std::size_t>(i)].push_back(held);
  least_[static_cast<std::size_t>(i)].emplace_back(
      static_cast<std::size_t>(model_->length - i) + 1, std::int64_t{-1});
  marked_[static_cast<std::size_t>(i)].emplace_back(
      static_cast<std::size_t>(model_->length - i) + 1, char{0});
  start_frames_[static_cast<std::size_t>(i)].emplace_back();
  return id;
}

StorageDp::Frame StorageDp::frame(int i, int l, int z) const {
  const Model& c = *model_;
  const int length = c.length;
  const auto ui = static_cast<std::size_t>(i);
  Frame f;
  const bool after_loss = l == length && c.output_held;
  if (i < length && !after_loss) {  // the same as below, from what every end shares
    const std::int64_t gradient = units(c.grad[static_cast<std::size_t>(l) + 1]);
    const StartFrame& s = start_frame(i, z);
    if (i < l) {
      f.own = s.own;
      f.leaf_base = s.own + gradient;
      f.left_z = z;
      f.step.first_z = s.first_z;
      f.step.first_shift = s.first_shift;
    }
    f.step.need = std::max(s.forward_base + gradient, s.backward);
    f.step.time = c.fw[ui] + c.bw[ui];
    return f;
  }
  // A copy: interning a state of start i below may grow state_sets_[i].
  const std::vector<int> held = state_sets_[ui][static_cast<std::size_t>(z)];
  const std::vector<int>& xi = c.x[ui];
  if (i == length) {  // the loss
    f.step.need = units(c.minus(c.x[ui], held)) + units(c.grad[ui]) + units(c.bt[ui]);
    return f;
  }
  // From here on the segment ends at the loss with x_L held (after_loss): the caller's x_L
  // joins what the start holds.
  const std::int64_t own = units(c.minus(xi, held));
  const std::int64_t gradient = units(c.grad[static_cast<std::size_t>(l) + 1]);
  if (i < l) {
    f.own = own;
    f.leaf_base = own + gradient;
    f.left_z = state(i, Model::join(held, Model::meet(xi, c.x[static_cast<std::size_t>(length)])));
    f.left_shift = units(c.minus(c.x[static_cast<std::size_t>(length)], held));
  }
  const std::vector<int>& kept = c.kept[ui];
  const std::int64_t state_units = units(c.state[ui]);
  const std::int64_t forward =
      own + gradient + units(c.minus(c.x[ui + 1], xi)) + state_units + units(c.ft[ui]);
  const std::int64_t backward =
      units(c.minus(Model::join(kept, c.x[static_cast<std::size_t>(length)]), held)) +
      state_units + units(c.backward_gradients(ui)) + units(c.bt[ui]);
  f.step.need = std::max(forward, backward);
  f.step.time = c.fw[ui] + c.bw[ui];
  if (i < l) {
    f.step.first_z = state(i + 1, Model::meet(c.x[ui + 1], Model::join(held, kept)));
    f.step.first_shift = units(c.minus(kept, held)) + state_units;
  }
  return f;
}

const StorageDp::StartFrame& StorageDp::start_frame(int i, int z) const {
  StartFrame& s = start_frames_[static_cast<std::size_t>(i)][static_cast<std::size_t>(z)];
  if (s.ready) return s;
  REMAT_INTERNAL_ASSERT(!frozen_, "storage table: the frame of a state of start ", i,
                        " not worked out");
  const Model& c = *model_;
  const auto ui = static_cast<std::size_t>(i);
  const std::vector<int> held = state_sets_[ui][static_cast<std::size_t>(z)];  // a copy
  const std::vector<int>& xi = c.x[ui];
  const std::vector<int>& kept = c.kept[ui];
  const std::int64_t state_units = units(c.state[ui]);
  StartFrame out;
  out.own = units(c.minus(xi, held));
  out.forward_base = out.own + units(c.minus(c.x[ui + 1], xi)) + state_units + units(c.ft[ui]);
  out.backward = units(c.minus(kept, held)) + state_units +
                 units(c.backward_gradients(ui)) + units(c.bt[ui]);
  out.first_z = state(i + 1, Model::meet(c.x[ui + 1], Model::join(held, kept)));
  out.first_shift = units(c.minus(kept, held)) + state_units;
  out.ready = true;
  s = out;  // interning a state of start i + 1 above leaves start i's frames where they are
  return s;
}

StorageDp::Choice StorageDp::leaf(const Frame& f, const LeafPart& part, int j) {
  Choice out;
  out.j = j;
  out.need = f.leaf_base + part.forwards;
  out.time = part.time;
  out.first_z = part.right_z;
  out.first_shift = f.own;
  out.second_z = f.left_z;
  out.second_shift = f.left_shift;
  return out;
}

std::vector<StorageDp::Choice> StorageDp::choices(int i, int l, int z) const {
  const Frame f = frame(i, l, z);
  std::vector<Choice> out;
  if (i < l && i < model_->length) {
    const std::vector<LeafPart>& parts = leaf_parts(i);
    out.reserve(static_cast<std::size_t>(l - i) + 1);
    for (int j = i + 1; j <= l; ++j) out.push_back(leaf(f, parts[static_cast<std::size_t>(j)], j));
  }
  out.push_back(f.step);
  return out;
}

const std::vector<StorageDp::LeafPart>& StorageDp::leaf_parts(int i) const {
  std::vector<LeafPart>& parts = leaf_parts_[static_cast<std::size_t>(i)];
  if (!parts.empty()) return parts;
  const Model& c = *model_;
  const std::vector<int>& xi = c.x[static_cast<std::size_t>(i)];
  parts.resize(static_cast<std::size_t>(c.length) + 1);
  double prefix = 0;
  std::int64_t forwards = 0;
  for (int j = i + 1; j <= c.length; ++j) {
    const auto k = static_cast<std::size_t>(j - 1);
    prefix += c.nf[k];
    forwards = std::max(forwards, units(c.minus(c.x[k], xi)) +
                                      units(c.minus(c.x[k + 1], c.x[k])) + units(c.nt[k]));
    LeafPart& part = parts[static_cast<std::size_t>(j)];
    part.forwards = forwards;
    part.time = prefix + c.restart_after(j);
    part.right_z = state(j, Model::meet(xi, c.x[static_cast<std::size_t>(j)]));
  }
  return parts;
}

StorageDp::Entry& StorageDp::entry(int i, int l, int z) {
  return entries_[static_cast<std::size_t>(i)][static_cast<std::size_t>(z)]
                 [static_cast<std::size_t>(l - i)];
}

const RowView& StorageDp::find_row(int i, int l, int z) const {
  static const RowView kEmpty;
  const std::vector<std::vector<Entry>>& states = entries_[static_cast<std::size_t>(i)];
  if (static_cast<std::size_t>(z) >= states.size()) return kEmpty;
  const std::vector<Entry>& rows = states[static_cast<std::size_t>(z)];
  return static_cast<std::size_t>(l - i) < rows.size() ? rows[static_cast<std::size_t>(l - i)].row
                                                       : kEmpty;
}

std::int64_t StorageDp::least(int i, int l, int z) {
  // A row of least memories keeps its buffer: interning a state moves the rows of its start
  // into a larger list, and a moved std::vector keeps its elements where they are.
  std::int64_t* memo = &least_[static_cast<std::size_t>(i)][static_cast<std::size_t>(z)]
                              [static_cast<std::size_t>(l - i)];
  if (*memo >= 0) return *memo;
  // The least over the choices of the most each needs. A choice whose first need is already at
  // least the best so far cannot lower it: its parts' least memories are not asked for (they
  // are worked out when a row the table needs reads them).
  const Frame f = frame(i, l, z);
  std::int64_t best = f.step.need;
  if (i < l) {
    best = std::max(best, f.step.first_shift + least(i + 1, l, f.step.first_z));
    const std::vector<LeafPart>& parts = leaf_parts(i);
    // The left parts (i, j-1, left_z) side by side, the right parts' read in place: the
    // recursion only where one is not yet known.
    const std::int64_t* left =
        least_[static_cast<std::size_t>(i)][static_cast<std::size_t>(f.left_z)].data();
    for (int j = i + 1; j <= l; ++j) {
      const LeafPart& part = parts[static_cast<std::size_t>(j)];
      std::int64_t need = f.leaf_base + part.forwards;
      if (need >= best) break;  // forwards only grow with j
      std::int64_t left_least = left[j - 1 - i];
      if (left_least < 0) left_least = least(i, j - 1, f.left_z);
      need = std::max(need, f.left_shift + left_least);
      if (need >= best) continue;
      std::int64_t right_least = least_[static_cast<std::size_t>(j)]
                                       [static_cast<std::size_t>(part.right_z)]
                                       [static_cast<std::size_t>(l - j)];
      if (right_least < 0) right_least = least(j, l, part.right_z);
      best = std::min(best, std::max(need, f.own + right_least));
    }
  }
  *memo = best;
  return best;
}

bool StorageDp::mark(int i, int l, int z, Marking& marking) {
  // Every row the root reaches, by length from the longest (a row's parts are shorter): the
  // rows that weigh most are counted first, so that a table over the allowance is given up
  // after few of its rows. The rows marked, and whether the table is given up, do not depend on
  // the order.
  const auto reach = [&](int first, int last, int state) {
    char& marked = marked_[static_cast<std::size_t>(first)][static_cast<std::size_t>(state)]
                          [static_cast<std::size_t>(last - first)];
    if (marked) return;
    marked = 1;
    marking.by_length[static_cast<std::size_t>(last - first)].push_back(Key{first, last, state});
  };
  reach(i, l, z);
  for (int length = l - i; length >= 0; --length) {
    // Rows of this length are added only while longer ones are visited: the list is complete.
    const std::vector<Key>& keys = marking.by_length[static_cast<std::size_t>(length)];
    for (std::size_t k = 0; k < keys.size(); ++k) {
      const Key key = keys[k];
      const std::int64_t lo = least(key.i, key.l, key.z);
      if (lo >= width_) continue;
      // The work the row will take (an upper bound: each choice over the row's width).
      const double width = static_cast<double>(width_ - lo);
      marking.cells += width;
      marking.work += width * (key.l - key.i + 1);
      if (marking.cells > marking.max_cells || marking.work > marking.max_work) return false;
      if (key.i == key.l) continue;
      // Only the parts of choices that fit within the table at some memory: a choice that
      // needs more (or whose parts do) relaxes nothing in compute_row, and rebuild() never
      // follows it.
      const Frame f = frame(key.i, key.l, key.z);
      if (f.step.need < width_ &&
          f.step.first_shift + least(key.i + 1, key.l, f.step.first_z) < width_)
        reach(key.i + 1, key.l, f.step.first_z);
      const std::vector<LeafPart>& parts = leaf_parts(key.i);
      for (int j = key.i + 1; j <= key.l; ++j) {
        const LeafPart& part = parts[static_cast<std::size_t>(j)];
        if (f.leaf_base + part.forwards >= width_) break;  // forwards only grow with j
        if (f.left_shift + least(key.i, j - 1, f.left_z) >= width_ ||
            f.own + least(j, key.l, part.right_z) >= width_)
          continue;
        reach(j, key.l, part.right_z);
        reach(key.i, j - 1, f.left_z);
      }
    }
  }
  return true;
}

// The row is the least of its choices, each a candidate made of the rows it reads, shifted
// (relax.h): a leaf, (time + Opt(j, l, Z_right)[m - first_shift]) + Opt(i, j-1, Z')[m -
// second_shift], as rebuild() sums it; the chain step, time + Opt(i+1, l, Z_rest)[m -
// first_shift].
void StorageDp::compute_row(const Key& key, double* best) {
  const auto [i, l, z] = key;
  const std::int64_t lo = least_[static_cast<std::size_t>(i)][static_cast<std::size_t>(z)]
                               [static_cast<std::size_t>(l - i)];
  if (lo >= width_) return;
  const std::int64_t last = width_ - 1;
  std::int64_t size = 1;
  if (i == l) {  // one choice, which needs lo
    best[0] = choices(i, l, z).front().time;
  } else {
    std::fill(best, best + (width_ - lo), kInfinity);
    for (const Choice& choice : choices(i, l, z)) {
      const RowView& first = choice.j > 0 ? find_row(choice.j, l, choice.first_z)
                                          : find_row(i + 1, l, choice.first_z);
      if (first.empty()) continue;
      const std::int64_t start = std::max({lo, choice.need, choice.first_shift + first.lo});
      if (choice.j == 0) {
        relax_one(best, lo, last, start, choice.time, first, choice.first_shift);
        continue;
      }
      const RowView& second = find_row(i, choice.j - 1, choice.second_z);
      if (second.empty()) continue;
      relax_pair(best, lo, last, std::max(start, choice.second_shift + second.lo), choice.time,
                 first, choice.first_shift, second, choice.second_shift);
    }
    REMAT_INTERNAL_ASSERT(best[0] < kInfinity, "storage row (", i, ", ", l, ", ", z,
                          ") infinite at its least memory ", lo);
    // Stored up to where it becomes constant.
    size = width_ - lo;
    while (size > 1 && best[size - 2] == best[size - 1]) --size;
  }
  Entry& out = entry(i, l, z);
  out.values = std::make_unique<double[]>(static_cast<std::size_t>(size));
  std::copy(best, best + size, out.values.get());
  out.row = RowView{out.values.get(), lo, lo + size - 1, best[size - 1]};
}

std::unique_ptr<StorageDp> StorageDp::build(const Chain& chain, std::int64_t unit_bytes,
                                            std::int64_t capacity_units, bool use_nograd_time,
                                            std::int64_t max_cells, double max_work,
                                            int threads) {
  REMAT_INTERNAL_ASSERT(unit_bytes >= 1 && capacity_units >= 0);
  const double length = chain.length() + 1.0;
  // Every row has at least one leaf per stage between its ends: a lower bound of the work.
  if (length * length * length / 6.0 * static_cast<double>(capacity_units) > max_work) return {};
  std::unique_ptr<StorageDp> dp(new StorageDp(chain, unit_bytes, use_nograd_time));
  dp->width_ = capacity_units - dp->units(dp->model_->context) -
               dp->units(dp->model_->minus(dp->model_->x[0], {})) + 1;
  if (dp->width_ <= 0) return dp;
  // The reachable segments and their least memories, the rows the root needs, then the work
  // they would take.
  const std::int64_t root = dp->least(0, chain.length(), dp->root_z_);
  if (root >= dp->width_) return dp;
  Marking marking;
  marking.by_length.resize(static_cast<std::size_t>(chain.length()) + 1);
  marking.max_cells = static_cast<double>(max_cells);
  marking.max_work = max_work;
  if (!dp->mark(0, chain.length(), dp->root_z_, marking)) return {};
  // The workers read each marked row's start frame: worked out here, not by them.
  for (const std::vector<Key>& keys : marking.by_length)
    for (const Key& key : keys)
      if (key.i < chain.length()) (void)dp->start_frame(key.i, key.z);
  dp->frozen_ = true;
  const std::vector<std::vector<Key>>& by_length = marking.by_length;
  // Room for every marked row, which the workers fill.
  for (const std::vector<Key>& keys : by_length)
    for (const Key& key : keys) {
      auto& states = dp->entries_[static_cast<std::size_t>(key.i)];
      if (states.size() <= static_cast<std::size_t>(key.z))
        states.resize(static_cast<std::size_t>(key.z) + 1);
      auto& rows = states[static_cast<std::size_t>(key.z)];
      if (rows.empty()) rows.resize(static_cast<std::size_t>(chain.length() - key.i) + 1);
    }
  const double work = marking.work;
  if (threads <= 0)
    threads = work < 2e7 ? 1 : available_cores();
  WorkerPool pool(std::max(1, threads));
  std::vector<std::vector<double>> scratch(
      static_cast<std::size_t>(pool.size()), std::vector<double>(static_cast<std::size_t>(dp->width_)));
  // A row reads shorter rows only: each length's rows are independent of each other.
  for (const std::vector<Key>& keys : by_length)
    pool.run(static_cast<std::int64_t>(keys.size()), [&](std::int64_t k, int worker) {
      dp->compute_row(keys[static_cast<std::size_t>(k)],
                      scratch[static_cast<std::size_t>(worker)].data());
    });
  return dp;
}

std::int64_t StorageDp::least_bytes(const Chain& chain) {
  StorageDp dp(chain, 1, true);
  return dp.least(0, chain.length(), dp.root_z_) + dp.model_->context +
         dp.model_->minus(dp.model_->x[0], {});
}

StorageTable storage_table(const Chain& chain, std::int64_t budget, bool filled,
                           bool use_nograd_time, std::int64_t memory_limit_bytes, int threads) {
  const MemoryLimit limit = memory_limit(memory_limit_bytes);
  StorageTable out;
  for (std::int64_t slots = slot_count(chain, 0);; slots /= 2) {
    slots = std::max<std::int64_t>(slots, 500);
    out.discretization = filled ? discretize_filled(budget, slots) : discretize(budget, slots);
    out.table = StorageDp::build(chain, out.discretization.unit_bytes,
                                 out.discretization.capacity_units, use_nograd_time,
                                 limit.bytes / static_cast<std::int64_t>(2 * sizeof(double)),
                                 kStorageDpWork, threads);
    if (out.table || slots <= 500) return out;
  }
}

Sequence StorageDp::least_sequence(const Chain& chain) {
  StorageDp dp(chain, 1, true);
  Sequence out;
  dp.rebuild_least(0, chain.length(), dp.root_z_, out);
  return out;
}

// Follows a choice that reaches the segment's least memory (the first one).
void StorageDp::rebuild_least(int i, int l, int z, Sequence& out) {
  if (i == l) {
    append_single_stage(i, model_->length, out);
    return;
  }
  const std::int64_t target = least(i, l, z);
  for (const Choice& choice : choices(i, l, z)) {
    if (choice.j > 0) {
      if (std::max({choice.need, choice.first_shift + least(choice.j, l, choice.first_z),
                    choice.second_shift + least(i, choice.j - 1, choice.second_z)}) != target)
        continue;
      append_leaf_forwards(i, choice.j, out);
      rebuild_least(choice.j, l, choice.first_z, out);
      rebuild_least(i, choice.j - 1, choice.second_z, out);
      return;
    }
    if (std::max(choice.need, choice.first_shift + least(i + 1, l, choice.first_z)) != target)
      continue;
    out.push_back(fe(i));
    rebuild_least(i + 1, l, choice.first_z, out);
    out.push_back(bwd(i));
    return;
  }
  REMAT_INTERNAL_ASSERT(false, "storage table: no choice reaches MinMem(", i, ", ", l, ", ", z,
                        ")");
}

std::int64_t StorageDp::root_memory(std::int64_t bytes) const {
  return bytes / unit_ - units(model_->context) - units(model_->minus(model_->x[0], {}));
}

double StorageDp::value_at(std::int64_t bytes) const {
  const std::int64_t m = root_memory(bytes);
  REMAT_INTERNAL_ASSERT(m < width_, "storage table: ", bytes, " bytes above its capacity");
  return find_row(0, model_->length, root_z_).at(m);
}

Sequence StorageDp::sequence_at(std::int64_t bytes) const {
  Sequence out;
  if (value_at(bytes) == kInfinity) return out;
  rebuild(0, model_->length, root_z_, root_memory(bytes), out);
  return out;
}

void StorageDp::rebuild(int i, int l, int z, std::int64_t m, Sequence& out) const {
  if (i == l) {
    append_single_stage(i, model_->length, out);
    return;
  }
  // The states were interned when the row was computed: recomputing finds the same ids.
  const std::vector<Choice> options = choices(i, l, z);
  const double target = find_row(i, l, z).at(m);
  for (const Choice& choice : options) {
    if (m < choice.need) continue;
    if (choice.j > 0) {
      const RowView& right = find_row(choice.j, l, choice.first_z);
      const RowView& left = find_row(i, choice.j - 1, choice.second_z);
      const double v = (choice.time + right.at(m - choice.first_shift)) +
                       left.at(m - choice.second_shift);
      if (v != target) continue;
      append_leaf_forwards(i, choice.j, out);
      rebuild(choice.j, l, choice.first_z, m - choice.first_shift, out);
      rebuild(i, choice.j - 1, choice.second_z, m - choice.second_shift, out);
      return;
    }
    const RowView& rest = find_row(i + 1, l, choice.first_z);
    if (choice.time + rest.at(m - choice.first_shift) != target)
      continue;
    out.push_back(fe(i));
    rebuild(i + 1, l, choice.first_z, m - choice.first_shift, out);
    out.push_back(bwd(i));
    return;
  }
  REMAT_INTERNAL_ASSERT(false, "storage table: no choice reaches Opt(", i, ", ", l, ", ", z, ", ",
                        m, ")");
}

}  // namespace detail
}  // namespace remat
