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
  auto units = [unit_bytes](std::int64_t bytes) { return (bytes + unit_bytes - 1) / unit_bytes; };
  UnitChain c;
  c.length = length;
  c.published_chain_step = published_chain_step;
  c.x.assign(n + 2, 0);
  c.xb.assign(n + 2, 0);
  c.ft.assign(n + 1, 0);
  c.bt.assign(n + 1, 0);
  c.fw.assign(n + 1, 0.0);
  c.bw.assign(n + 1, 0.0);
  c.nf.assign(n + 1, 0.0);
  c.x[0] = units(chain.input_bytes);
  c.xb[0] = c.x[0];
  for (std::size_t i = 0; i < n; ++i) {
    const Stage& stage = chain.stages[i];
    c.x[i + 1] = units(stage.out_bytes);
    c.xb[i + 1] = units(stage.saved_bytes);
    c.ft[i] = units(stage.fwd_tmp_bytes);
    c.bt[i] = units(stage.bwd_tmp_bytes);
    c.fw[i] = stage.fwd_ms;
    c.bw[i] = stage.bwd_ms;
    c.nf[i] = use_nograd_time ? stage.nograd_ms() : stage.fwd_ms;
  }
  c.bt[n] = units(chain.loss_tmp_bytes);
  return c;
}

namespace {

// min over j of max(xj[k] + column[k], row[k]) for k in [0, n): the leaf choices.
template <class T>
T min_of_max_body(const T* __restrict xj, const T* __restrict column, const T* __restrict row,
                  std::size_t n) {
  T best = std::numeric_limits<T>::max();
  for (std::size_t k = 0; k < n; ++k) {
    const T a = xj[k] + column[k];
    const T v = a > row[k] ? a : row[k];
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
std::int64_t min_of_max(const std::int64_t* __restrict xj, const std::int64_t* __restrict column,
                        const std::int64_t* __restrict row, std::size_t n) {
  return min_of_max_body(xj, column, row, n);
}

REMAT_MIN_OF_MAX_CLONES
std::int32_t min_of_max(const std::int32_t* __restrict xj, const std::int32_t* __restrict column,
                        const std::int32_t* __restrict row, std::size_t n) {
  return min_of_max_body(xj, column, row, n);
}

// Below 2^29, sums of two clamped values stay within 32 bits.
constexpr std::int64_t kNarrowLimit = std::int64_t{1} << 29;

}  // namespace

// MinMem(i, i) = max(x[i+1] + xb[i+1] + ft[i], x[i] + x[i+1] + xb[i+1] + bt[i])
// MinMem(i, l) = max(mmin(i, l), min(min_{i<j<=l} max(x[j] + MinMem(j, l), MinMem(i, j-1)),
//                                    max(chain_step_memory(i, l), xb[i+1] + MinMem(i+1, l))))
// with mmin(i, l) = x[l+1] + max(x[i+1] + ft[i], max_{i<k<l} x[k] + x[k+1] + ft[k]): the
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
    build<std::int64_t>(c, std::numeric_limits<std::int64_t>::max());
}

template <class T>
void MinMemoryTable::build(const UnitChain& c, std::int64_t limit) {
  const int length = c.length;
  const auto clamp = [limit](std::int64_t v) { return static_cast<T>(v < limit ? v : limit); };
  std::vector<T> x(c.x.size());
  for (std::size_t k = 0; k < x.size(); ++k) x[k] = clamp(c.x[k]);
  // Row i of the table (mm[i * stride + l] = MinMem(i, l)) and column l, transposed
  // (mm_t[l * stride + j] = MinMem(j, l)), so that the leaf loop reads memory contiguously.
  std::vector<T> mm(stride_ * stride_, 0), mm_t(stride_ * stride_, 0);
  auto at = [&](int i, int l) -> T& {
    return mm[static_cast<std::size_t>(i) * stride_ + static_cast<std::size_t>(l)];
  };
  for (int i = length; i >= 0; --i) {
    const auto ui = static_cast<std::size_t>(i);
    at(i, i) = clamp(std::max(c.x[ui + 1] + c.xb[ui + 1] + c.ft[ui],
                              c.x[ui] + c.x[ui + 1] + c.xb[ui + 1] + c.bt[ui]));
    mm_t[ui * stride_ + ui] = at(i, i);
    std::int64_t inner_forward = 0;  // max_{i<k<l} x[k] + x[k+1] + ft[k]
    for (int l = i + 1; l <= length; ++l) {
      const auto ul = static_cast<std::size_t>(l);
      if (l > i + 1) inner_forward = std::max(inner_forward, c.x[ul - 1] + c.x[ul] + c.ft[ul - 1]);
      const std::int64_t mmin = c.x[ul + 1] + std::max(c.x[ui + 1] + c.ft[ui], inner_forward);
      const std::int64_t leaf =
          min_of_max(&x[ui + 1], &mm_t[ul * stride_ + ui + 1], &mm[ui * stride_ + ui], ul - ui);
      const std::int64_t chain_step =
          std::max(c.chain_step_memory(i, l), c.xb[ui + 1] + std::int64_t{at(i + 1, l)});
      at(i, l) = clamp(std::max(mmin, std::min(leaf, chain_step)));
      mm_t[ul * stride_ + ui] = at(i, l);
    }
  }
  mm_.assign(mm.begin(), mm.end());
}

bool fits(const UnitChain& chain, const MinMemoryTable& table, std::int64_t capacity_units) {
  const std::int64_t available = capacity_units - chain.x[0];
  return available >= 1 && available >= table.at(0, chain.length);
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
