#pragma once
// A small pool of worker threads for the dynamic programs (worker_pool.cpp).

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace remat {
namespace detail {

// A pool of worker threads; run() executes body(index, worker) for every index in
// [0, count) and returns when all are done. The calling thread works as worker 0.
class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  int size() const { return static_cast<int>(workers_.size()) + 1; }
  void run(std::int64_t count, const std::function<void(std::int64_t, int)>& body);

 private:
  void work(int worker);
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  const std::function<void(std::int64_t, int)>* body_ = nullptr;
  std::int64_t count_ = 0;
  std::atomic<std::int64_t> next_{0};
  int busy_ = 0;
  std::exception_ptr error_;
};

}  // namespace detail
}  // namespace remat
