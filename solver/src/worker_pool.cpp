// The dynamic programs' worker pool (worker_pool.h).
#include "worker_pool.h"

namespace remat {
namespace detail {

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
