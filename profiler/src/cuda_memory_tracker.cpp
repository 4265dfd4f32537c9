// CUDA memory: the caching allocator's allocated-bytes statistics (current and peak), which
// count the bytes of live tensor blocks (rounded up to the allocator's 512-byte granularity).
// Compiled only when the LibTorch found has CUDA.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail.h"
#include "remat/core/cuda_device.h"

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

// DeviceStats::num_device_alloc and num_device_free (calls of cudaMalloc and cudaFree)
// appeared in LibTorch 2.1, with num_sync_all_streams.
template <typename Stats, typename = void>
struct HasDeviceAllocCount : std::false_type {};
template <typename Stats>
struct HasDeviceAllocCount<Stats, std::void_t<decltype(std::declval<Stats&>().num_device_alloc)>>
    : std::true_type {};

template <typename Stats>
void read_device_calls(const Stats& stats, CudaAllocatorStats& out) {
  if constexpr (HasDeviceAllocCount<Stats>::value) {
    out.device_allocs = stats.num_device_alloc;
    out.device_frees = stats.num_device_free;
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

// The device's index, after LibTorch has started CUDA on it. The caching allocator is set up
// when ATen first makes a CUDA tensor (its lazy initialization): before, its statistics throw
// "Invalid device argument: did you call init?" and setMemoryFraction fails an assertion. A
// tensor of no elements starts it on every LibTorch version (lazyInitCUDA was renamed
// lazyInitDevice in 2.x) and allocates nothing.
int device_or_current(int device_index) {
  const int index = checked_cuda_device(device_index, "memory");
  static std::once_flag started;
  std::call_once(started, [] {
    (void)at::empty({0}, at::TensorOptions().device(c10::kCUDA, c10::cuda::current_device()));
  });
  return index;
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
  out.alloc_retries = stats.num_alloc_retries;
  read_device_calls(stats, out);
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

std::int64_t cuda_free_bytes(int device_index) {
  const int index = device_or_current(device_index);
  std::size_t free_bytes = 0, total_bytes = 0;
  {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
    C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  }
  const CudaAllocatorStats stats = cuda_allocator_stats(index);
  return static_cast<std::int64_t>(free_bytes) + std::max<std::int64_t>(0, stats.reserved - stats.allocated);
}

bool exact_cuda_blocks() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  // The user's settings: PYTORCH_CUDA_ALLOC_CONF, else the device-generic PYTORCH_ALLOC_CONF.
  const char* given = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  if (given == nullptr || *given == '\0') given = std::getenv("PYTORCH_ALLOC_CONF");
  const std::string settings = given == nullptr ? "" : given;
  if (settings.find("expandable_segments") == std::string::npos &&
      !alloc::CUDAAllocatorConfig::expandable_segments()) {
    // The whole string again: the user's other settings stay as they were.
    alloc::setAllocatorSettings(settings.empty() ? "expandable_segments:True"
                                                 : settings + ",expandable_segments:True");
  }
  return alloc::CUDAAllocatorConfig::expandable_segments();
#else
  return false;
#endif
}

}  // namespace detail
}  // namespace remat
