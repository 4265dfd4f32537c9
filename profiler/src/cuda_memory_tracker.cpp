// CUDA memory: the caching allocator's allocated-bytes statistics (current and peak), which
// count the bytes of live tensor blocks (rounded up to the allocator's 512-byte granularity).
// Compiled only when the LibTorch found has CUDA.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>

#include "detail.h"

namespace remat {
namespace detail {
namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;

// The allocated-bytes statistic over all pools of a device. The type of the statistics
// moved between LibTorch versions (c10::cuda::CUDACachingAllocator in 1.x,
// c10::CachingDeviceAllocator in 2.6+), hence auto; StatType::AGGREGATE is the first entry.
auto allocated_bytes(c10::DeviceIndex index) { return alloc::getDeviceStats(index).allocated_bytes[0]; }

// DeviceStats::requested_bytes appeared in LibTorch 2.1.
template <typename Stats, typename = void>
struct HasRequestedBytes : std::false_type {};
template <typename Stats>
struct HasRequestedBytes<Stats, std::void_t<decltype(std::declval<Stats&>().requested_bytes)>>
    : std::true_type {};

// A template, so that the branch is not compiled where the statistic does not exist.
template <typename Stats>
void read_requested_bytes(const Stats& stats, CudaAllocatorStats& out) {
  if constexpr (HasRequestedBytes<Stats>::value) {
    out.requested = stats.requested_bytes[0].current;
    out.requested_peak = stats.requested_bytes[0].peak;
  }
}

class CudaMemoryTracker final : public MemoryTracker {
 public:
  explicit CudaMemoryTracker(int index) : index_(static_cast<c10::DeviceIndex>(index)) {}
  std::int64_t live() const override { return allocated_bytes(index_).current; }
  std::int64_t peak() const override { return allocated_bytes(index_).peak; }
  void reset_peak() override { alloc::resetPeakStats(index_); }
  c10::Device device() const override { return c10::Device(c10::kCUDA, index_); }

 private:
  c10::DeviceIndex index_;
};

int device_or_current(int device_index) {
  TORCH_CHECK(c10::cuda::device_count() > 0,
              "remat: CUDA memory was asked for, but no GPU is visible");
  return device_index < 0 ? c10::cuda::current_device() : device_index;
}

}  // namespace

MemoryTracker& cuda_memory_tracker(int device_index) {
  const int index = device_or_current(device_index);
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<CudaMemoryTracker>> trackers;
  std::lock_guard<std::mutex> lock(mutex);
  auto& tracker = trackers[index];
  if (!tracker) tracker = std::make_unique<CudaMemoryTracker>(index);
  return *tracker;
}

CudaAllocatorStats cuda_allocator_stats(int device_index) {
  const auto index = static_cast<c10::DeviceIndex>(device_or_current(device_index));
  const auto stats = alloc::getDeviceStats(index);
  CudaAllocatorStats out;
  out.allocated = stats.allocated_bytes[0].current;
  out.allocated_peak = stats.allocated_bytes[0].peak;
  out.reserved = stats.reserved_bytes[0].current;
  out.reserved_peak = stats.reserved_bytes[0].peak;
  read_requested_bytes(stats, out);
  return out;
}

void limit_cuda_memory(int device_index, std::int64_t bytes) {
  const int index = device_or_current(device_index);
  std::size_t free_bytes = 0, total_bytes = 0;
  {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
    C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  }
  const double fraction =
      bytes == 0 ? 1.0 : std::min(1.0, static_cast<double>(bytes) / static_cast<double>(total_bytes));
  alloc::setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(index));
}

}  // namespace detail
}  // namespace remat
