#include <algorithm>
#include <limits>

#include "detail.h"
#include "remat/solver/check.h"

namespace remat {
namespace detail {

UnitChain make_unit_chain(const Chain& chain, std::int64_t unit_bytes, bool use_nograd_time,
                          bool published_chain_step) {
  REMAT_INTERNAL_ASSERT(unit_bytes >= 1);
  const int length = chain.length();
  const auto n = static_cast<std::size_t>(length);
  // ceil(bytes / unit), without forming bytes + unit - 1 (the unit can be near int64's largest).
  auto units = [unit_bytes](std::int64_t bytes) {
    return bytes / unit_bytes + (bytes % unit_bytes != 0 ? 1 : 0);
  };
  UnitChain c;
  c.length = length;
  c.published_chain_step = published_chain_step;
  c.x.assign(n + 2, 0);
  c.g.assign(n + 2, 0);
  for (auto* array : {&c.sv, &c.gk, &c.hf, &c.ht, &c.ft, &c.nt, &c.bt}) array->assign(n + 1, 0);
  c.fw.assign(n + 1, 0.0);
  c.bw.assign(n + 1, 0.0);
  c.nf.assign(n + 1, 0.0);
  for (int k = 0; k <= length; ++k) {
    c.x[static_cast<std::size_t>(k)] = units(chain.activation_bytes(k));
    c.g[static_cast<std::size_t>(k)] = units(chain.gradient_bytes(k));
  }
  // Bytes of the members of x_k listed in `a` or `b`, each once.
  auto kept = [&](int k, const std::vector<int>* a, const std::vector<int>* b) {
    std::vector<bool> in(chain.members(k).size(), false);
    for (const auto* list : {a, b})
      if (list)
        for (const int m : *list) in[static_cast<std::size_t>(m)] = true;
    std::int64_t bytes = 0;
    for (std::size_t m = 0; m < in.size(); ++m)
      if (in[m]) bytes += chain.members(k)[m].bytes;
    return units(bytes);
  };
  for (std::size_t i = 0; i < n; ++i) {
    const Stage& stage = chain.stages[i];
    const int k = static_cast<int>(i);
    c.gk[i] = units(stage.kept_bytes());
    // A stage that keeps its whole output holds it with its state from Fe_i to B_i: round
    // the two together, as the reference rounds its xbar (gk = xb, sv = xb - x).
    c.sv[i] = stage.saved_outputs.size() == stage.outputs.size() ? c.gk[i] - c.x[i + 1]
                                                                 : units(stage.state_bytes);
    c.hf[i] = i == 0 ? c.x[0] : kept(k, &stage.saved_inputs, nullptr);
    c.ht[i] = i == 0 ? c.x[0] : kept(k, &stage.saved_inputs, &chain.stages[i - 1].saved_outputs);
    c.ft[i] = units(stage.fwd_tmp_bytes);
    c.nt[i] = units(stage.nograd_tmp_bytes());
    c.bt[i] = units(stage.bwd_tmp_bytes);
    c.fw[i] = stage.fwd_ms;
    c.bw[i] = stage.bwd_ms;
    c.nf[i] = use_nograd_time ? stage.nograd_ms() : stage.fwd_ms;
  }
  c.hf[n] = c.ht[n] = c.x[n];
  c.bt[n] = units(chain.loss_tmp_bytes);
  c.context = units(chain.context_bytes);
  c.restart = chain.restart_ms;
  if (chain.output_held && !published_chain_step) {
    c.tail = c.x[n];
    // The members of x_L that stage L-1 keeps, rounded down: with the rest of its state
    // (gk, rounded up), they are never counted below their bytes.
    const Stage& last = chain.stages[n - 1];
    c.tail_shared = (last.kept_bytes() - last.state_bytes) / unit_bytes;
  }
  return c;
}

namespace {

// min over j of max(a + column[k], c + row[k], b + forward[k]) for k in [0, n): the leaf
// choices (c: the caller's x_L beside the left parts, when they run after the loss).
template <class T>
T min_of_max_body(T a, const T* __restrict column, T c, const T* __restrict row, T b,
                  const T* __restrict forward, std::size_t n) {
  T best = std::numeric_limits<T>::max();
  for (std::size_t k = 0; k < n; ++k) {
    const T right = a + column[k];
    const T left = c + row[k];
    const T leaf = b + forward[k];
    T v = right > left ? right : left;
    v = leaf > v ? leaf : v;
    best = v < best ? v : best;
  }
  return best;
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define REMAT_MIN_OF_MAX_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define REMAT_MIN_OF_MAX_CLONES
#endif

REMAT_MIN_OF_MAX_CLONES
std::int64_t min_of_max(std::int64_t a, const std::int64_t* __restrict column, std::int64_t c,
                        const std::int64_t* __restrict row, std::int64_t b,
                        const std::int64_t* __restrict forward, std::size_t n) {
  return min_of_max_body(a, column, c, row, b, forward, n);
}

REMAT_MIN_OF_MAX_CLONES
std::int32_t min_of_max(std::int32_t a, const std::int32_t* __restrict column, std::int32_t c,
                        const std::int32_t* __restrict row, std::int32_t b,
                        const std::int32_t* __restrict forward, std::size_t n) {
  return min_of_max_body(a, column, c, row, b, forward, n);
}

// Below 2^29, sums of two clamped values stay within 32 bits.
constexpr std::int64_t kNarrowLimit = std::int64_t{1} << 29;

}  // namespace

// With lf(i, j) = max(x[i+1] + nt[i], max_{i<k<j} x[k] + x[k+1] + nt[k]) (the forwards of a
// leaf's CF_i Fn_{i+1} .. Fn_{j-1}), for both states s of a segment start:
//
// MinMem(i, i, s) = max(forward_memory(i, i), backward_memory(i, s))
// MinMem(i, l, s) = min( min_{i<j<=l} max(x[i] + g[l+1] + lf(i, j), x[i] + MinMem(j, l, fresh),
//                                         left_shift(l) + MinMem(i, j-1, s)),
//                        max(chain_step_memory(i, l, s), chain_shift(i, s) + MinMem(i+1, l, taped))
//                        )
//
// (the published recurrence also bounds every row below by x[i] + g[l+1] + lf(i, l)): the
// conditions under which the dynamic program's row (i, l) is finite.
//
// Every term is built from the chain's sizes by +, max and min, all non-decreasing, with
// non-negative terms: computing on values clamped to C = exact_up_to + 1 gives min(MinMem, C)
// exactly (a term that reaches C stays at least C). When C is below 2^29 the table is
// computed in 32-bit integers, twice as many per vector instruction.
MinMemoryTable::MinMemoryTable(const UnitChain& c, std::int64_t exact_up_to)
    : stride_(static_cast<std::size_t>(c.length) + 1) {
  REMAT_INTERNAL_ASSERT(exact_up_to >= 0);
  if (exact_up_to < kNarrowLimit)
    build<std::int32_t>(c, exact_up_to + 1);
  else
    build<std::int64_t>(c, std::numeric_limits<std::int64_t>::max() / 4);
}

template <class T>
void MinMemoryTable::build(const UnitChain& c, std::int64_t limit) {
  const int length = c.length;
  const auto clamp = [limit](std::int64_t v) { return static_cast<T>(v < limit ? v : limit); };
  bool any_taped = false;
  for (int i = 0; i <= length; ++i) any_taped = any_taped || c.two_states(i);
  // Rows of the tables (mm[i * stride + l] = MinMem(i, l, .)) and the fresh one's columns,
  // transposed (mm_t[l * stride + j] = MinMem(j, l, fresh)), so that the leaf loop reads
  // memory contiguously.
  std::vector<T> mm(stride_ * stride_, 0), mm_t(stride_ * stride_, 0);
  std::vector<T> tp(any_taped ? stride_ * stride_ : 0, 0);
  std::vector<T> forward(stride_ + 1, 0);  // forward[j] = lf(i, j)
  auto table = [&](bool taped) -> std::vector<T>& { return taped ? tp : mm; };
  auto at = [&](int i, int l, bool taped) -> T& {
    const bool two = taped && c.two_states(i);
    return table(two)[static_cast<std::size_t>(i) * stride_ + static_cast<std::size_t>(l)];
  };
  for (int i = length; i >= 0; --i) {
    const auto ui = static_cast<std::size_t>(i);
    const int states = c.two_states(i) ? 2 : 1;
    for (int s = 0; s < states; ++s) {
      const bool taped = s == 1;
      at(i, i, taped) = clamp(std::max(c.forward_memory(i, i), c.backward_memory(i, taped)));
    }
    mm_t[ui * stride_ + ui] = at(i, i, false);
    std::int64_t lf = c.x[ui + 1] + c.nt[ui];
    for (int l = i + 1; l <= length; ++l) {
      const auto ul = static_cast<std::size_t>(l);
      if (l > i + 1) lf = std::max(lf, c.x[ul - 1] + c.x[ul] + c.nt[ul - 1]);
      forward[ul] = clamp(lf);  // lf(i, l)
      const T a = clamp(c.x[ui]);
      const T b = clamp(c.x[ui] + c.g[ul + 1]);
      for (int s = 0; s < states; ++s) {
        const bool taped = s == 1;
        const std::vector<T>& rows = table(taped && c.two_states(i));
        const std::int64_t leaf =
            min_of_max(a, &mm_t[ul * stride_ + ui + 1], clamp(c.left_shift(l)),
                       &rows[ui * stride_ + ui], b, &forward[ui + 1], ul - ui);
        const std::int64_t chain_step =
            std::max(c.chain_step_memory(i, l, taped),
                     c.chain_shift(i, taped) + std::int64_t{at(i + 1, l, true)});
        std::int64_t best = std::min(leaf, chain_step);
        if (c.published_chain_step) best = std::max(best, c.x[ui] + c.g[ul + 1] + lf);
        at(i, l, taped) = clamp(best);
      }
      mm_t[ul * stride_ + ui] = at(i, l, false);
    }
  }
  // Starts with one state read the same row in both.
  if (any_taped)
    for (int i = 0; i <= length; ++i)
      if (!c.two_states(i))
        std::copy_n(&mm[static_cast<std::size_t>(i) * stride_], stride_,
                    &tp[static_cast<std::size_t>(i) * stride_]);
  mm_.assign(mm.begin(), mm.end());
  taped_.assign(tp.begin(), tp.end());
}

// Among the sequences that need MinMem(0, L), the fastest: at each segment, of the choices
// that reach its MinMem, the one whose parts (each again the fastest at its own MinMem) take
// the least time. A lexicographic dynamic program (memory, then time) over the segments.
class MinMemoryTable::LeastMemory {
 public:
  LeastMemory(const MinMemoryTable& table, const UnitChain& chain)
      : t_(table),
        c_(chain),
        stride_(static_cast<std::size_t>(chain.length) + 1),
        time_(2 * stride_ * stride_, -1.0),
        choice_(2 * stride_ * stride_, -1) {}

  // The least time of a sequence reversing (i, l) from `taped` in MinMem(i, l, taped).
  double time(int i, int l, bool taped) {
    const std::size_t k = key(i, l, taped);
    if (time_[k] >= 0) return time_[k];
    const auto ui = static_cast<std::size_t>(i);
    if (i == l) {
      time_[k] = c_.fw[ui] + c_.bw[ui];
      return time_[k];
    }
    const std::int64_t target = t_.at(i, l, taped);
    double best = kInfinity;
    int best_choice = -1;  // j for a leaf, 0 for the chain step
    std::int64_t lf = c_.x[ui + 1] + c_.nt[ui];
    double prefix = 0;
    for (int j = i + 1; j <= l; ++j) {
      const auto uj = static_cast<std::size_t>(j);
      prefix += c_.nf[uj - 1];
      if (j > i + 1) lf = std::max(lf, c_.x[uj - 1] + c_.x[uj] + c_.nt[uj - 1]);
      const std::int64_t leaf =
          std::max({c_.x[ui] + c_.g[static_cast<std::size_t>(l) + 1] + lf,
                    c_.x[ui] + t_.at(j, l, false), c_.left_shift(l) + t_.at(i, j - 1, taped)});
      if (leaf != target) continue;
      const double candidate =
          (prefix + c_.restart_after(j)) + time(j, l, false) + time(i, j - 1, taped);
      if (candidate < best) best = candidate, best_choice = j;
    }
    const std::int64_t chain_step = std::max(c_.chain_step_memory(i, l, taped),
                                             c_.chain_shift(i, taped) + t_.at(i + 1, l, true));
    if (chain_step == target) {
      const double candidate = c_.fw[ui] + c_.bw[ui] + time(i + 1, l, true);
      if (candidate < best) best = candidate, best_choice = 0;
    }
    REMAT_INTERNAL_ASSERT(best_choice >= 0, "no choice reaches MinMem(", i, ", ", l,
                          taped ? ", taped" : "", ") = ", target);
    time_[k] = best;
    choice_[k] = best_choice;
    return best;
  }

  void rebuild(int i, int l, bool taped, Sequence& out) {
    if (i == l) {
      append_single_stage(i, c_.length, out);
      return;
    }
    time(i, l, taped);
    const int j = choice_[key(i, l, taped)];
    if (j > 0) {
      append_leaf_forwards(i, j, out);
      rebuild(j, l, false, out);
      rebuild(i, j - 1, taped, out);
    } else {
      out.push_back(fe(i));
      rebuild(i + 1, l, true, out);
      out.push_back(bwd(i));
    }
  }

 private:
  std::size_t key(int i, int l, bool taped) const {
    const bool two = taped && c_.two_states(i);
    return (two ? stride_ * stride_ : 0) + static_cast<std::size_t>(i) * stride_ +
           static_cast<std::size_t>(l);
  }
  const MinMemoryTable& t_;
  const UnitChain& c_;
  std::size_t stride_;
  std::vector<double> time_;
  std::vector<int> choice_;
};

Sequence MinMemoryTable::least_memory_sequence(const UnitChain& chain) const {
  // The published recurrence bounds whole rows, not choices: no choice need reach them.
  REMAT_INTERNAL_ASSERT(!chain.published_chain_step);
  LeastMemory search(*this, chain);
  Sequence out;
  search.rebuild(0, chain.length, false, out);
  return out;
}

bool fits(const UnitChain& chain, const MinMemoryTable& table, std::int64_t capacity_units) {
  const std::int64_t frame = capacity_units - chain.context;
  return frame - chain.x[0] >= 1 && frame >= table.at(0, chain.length);
}

WorkerPool::WorkerPool(int threads) {
  for (int w = 1; w < threads; ++w) workers_.emplace_back([this, w] { work(w); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void WorkerPool::run(std::int64_t count, const std::function<void(std::int64_t, int)>& body) {
  if (workers_.empty() || count <= 1) {
    for (std::int64_t index = 0; index < count; ++index) body(index, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    body_ = &body;
    count_ = count;
    next_ = 0;
    busy_ = static_cast<int>(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  std::exception_ptr mine;
  try {
    for (std::int64_t index = next_++; index < count; index = next_++) body(index, 0);
  } catch (...) {
    mine = std::current_exception();
    next_ = count;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return busy_ == 0; });
  body_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

void WorkerPool::work(int worker) {
  std::uint64_t seen = 0;
  for (;;) {
    const std::function<void(std::int64_t, int)>* body;
    std::int64_t count;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      body = body_;
      count = count_;
    }
    try {
      for (std::int64_t index = next_++; index < count; index = next_++) (*body)(index, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      next_ = count;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --busy_;
    }
    done_.notify_one();
  }
}

}  // namespace detail
}  // namespace remat
