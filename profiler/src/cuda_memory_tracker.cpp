// CUDA memory: the caching allocator's allocated-bytes statistics (current and peak), which
// count the bytes of live tensor blocks (rounded up to the allocator's 512-byte granularity).
// Compiled only when the LibTorch found has CUDA.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <map>
#include <memory>
#include <mutex>

#include "detail.h"

namespace remat {
namespace detail {
namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;

class CudaMemoryTracker final : public MemoryTracker {
 public:
  explicit CudaMemoryTracker(int index) : index_(static_cast<c10::DeviceIndex>(index)) {}
  std::int64_t live() const override { return aggregate().current; }
  std::int64_t peak() const override { return aggregate().peak; }
  void reset_peak() override { alloc::resetPeakStats(index_); }
  c10::Device device() const override { return c10::Device(c10::kCUDA, index_); }

 private:
  auto aggregate() const {
    const auto stats = alloc::getDeviceStats(index_);
    return stats.allocated_bytes[0];  // StatType::AGGREGATE is the first entry
  }
  c10::DeviceIndex index_;
};

}  // namespace

MemoryTracker& cuda_memory_tracker(int device_index) {
  if (c10::cuda::device_count() == 0)
    throw std::runtime_error("remat: CUDA memory was asked for, but no GPU is visible");
  const int index = device_index < 0 ? c10::cuda::current_device() : device_index;
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<CudaMemoryTracker>> trackers;
  std::lock_guard<std::mutex> lock(mutex);
  auto& tracker = trackers[index];
  if (!tracker) tracker = std::make_unique<CudaMemoryTracker>(index);
  return *tracker;
}

}  // namespace detail
}  // namespace remat
