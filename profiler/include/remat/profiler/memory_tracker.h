#pragma once
// Bytes of tensor storage, live and peak, on one device: what the cost model calls memory.
//
// CPU: a tracking allocator installed process-wide over LibTorch's default CPU allocator
// (c10::SetCPUAllocator with a higher priority). It counts every storage allocated through
// c10::GetCPUAllocator() after it is installed, including those made during backward and by
// raw_allocate, never process RSS. CUDA: the caching allocator's allocated-bytes statistics
// (compiled only when the LibTorch found has CUDA; see REMAT_WITH_CUDA in remat/config.h),
// which count each storage as the block that holds it: its size rounded up to 512 bytes.
// counted_bytes() gives that unit for any device; every size the profiler reports is in it.
//
//   remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(torch::kCPU);
//   tracker.reset_peak();
//   auto y = net->forward(x);
//   std::int64_t peak_activation_bytes = tracker.peak() - baseline;

#include <c10/core/Device.h>

#include <cstdint>

namespace remat {

class MemoryTracker {
 public:
  virtual ~MemoryTracker() = default;
  /// Bytes of tensor storage allocated now (since the tracker was installed, on CPU).
  virtual std::int64_t live() const = 0;
  /// The largest live() since the last reset_peak().
  virtual std::int64_t peak() const = 0;
  /// Makes peak() equal to live().
  virtual void reset_peak() = 0;
  /// Makes peak() at least `bytes` where the device's statistics allow it, so that a
  /// measurement of one operation (a reset_peak() before it) leaves an enclosing one intact.
  /// Returns false where they do not: CUDA, whose caching allocator's peak can only be reset.
  virtual bool raise_peak(std::int64_t bytes) {
    (void)bytes;
    return false;
  }
  virtual c10::Device device() const = 0;
  /// What this tracker counts for a storage of `nbytes` bytes (remat::counted_bytes).
  std::int64_t counted_bytes(std::int64_t nbytes) const;

  /// The tracker of a device. For the CPU this installs the tracking allocator on first use
  /// and checks that it is the active one; tensors allocated before then are not counted.
  /// Throws c10::Error for CUDA in a build without CUDA or without a visible GPU, or if another
  /// CPU allocator with a higher priority replaced ours; c10::ValueError for another device type.
  static MemoryTracker& for_device(c10::Device device);
};

/// Bytes that the tracker of `device` counts for a storage of `nbytes` bytes. CUDA: the caching
/// allocator's block, nbytes rounded up to a multiple of 512 (0 for 0). CPU: nbytes rounded up
/// to the CPU tracker's granularity (1, that is nbytes itself, unless set_cpu_granularity()).
///
/// Example: counted_bytes(torch::kCUDA, 4) == 512 (a float scalar); counted_bytes(torch::kCPU, 4) == 4.
std::int64_t counted_bytes(c10::Device device, std::int64_t nbytes);

/// For testing CUDA's accounting on a CPU: from now on the CPU tracker counts each allocation
/// as its size rounded up to `granularity` bytes (512 as CUDA's caching allocator; 1, the
/// default, exactly). Process-wide. Returns the previous granularity. Throws c10::ValueError
/// unless 1 <= granularity <= 2^20.
std::int64_t set_cpu_granularity(std::int64_t granularity);

/// Makes `device` refuse, with c10::OutOfMemoryError, what would take it beyond `bytes`, as a
/// smaller device would; 0 lifts remat's limit. CPU: an allocation that would take the CPU
/// tracker's live() above `bytes` (the tracker is installed if it was not). CUDA: the caching
/// allocator's memory fraction, bytes / the GPU's total memory (it bounds the memory the
/// allocator reserves from the GPU, its cache included). Process-wide. Throws c10::ValueError
/// for a negative size or another device type, c10::Error for CUDA without CUDA.
void limit_device_memory(c10::Device device, std::int64_t bytes);

/// Makes the CUDA caching allocator give each tensor a block of exactly counted_bytes(), so that
/// the memory the CUDA tracker measures is what the cost model counts: turns on the allocator's
/// expandable segments, as PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would. Without
/// them, the allocator hands a large tensor (over 1 MiB) a cached or new block whole when less
/// than 1 MiB of it would be left over, and a measured peak can exceed the prediction, and the
/// budget, by up to 1 MiB per such tensor. A choice the user made in PYTORCH_CUDA_ALLOC_CONF or
/// PYTORCH_ALLOC_CONF (expandable_segments given there, true or false) is kept; their other
/// settings are kept too. remat::profile calls it when it measures on a GPU, and the `remat`
/// commands at start-up with --device cuda; a program that measures plain training to compare
/// calls it first. Process-wide. Returns whether the allocator now uses expandable segments
/// (false where the platform lacks them, in a build without CUDA, or before LibTorch 2.1).
bool exact_cuda_blocks();

/// The CUDA caching allocator's own statistics, in bytes, for telling apart the causes of a
/// gap between the measured and the predicted memory on a GPU. `allocated`: the blocks that
/// hold live tensors (what the CUDA tracker counts; a block can exceed its tensor's rounded size
/// where the allocator reused a cached block without splitting it). `requested`: the tensors'
/// exact sizes (-1 with a LibTorch older than 2.1, which lacks the statistic). `reserved`: the
/// segments the allocator holds from the GPU, its cache and fragmentation included. Each is
/// current and peak, peaks since the CUDA tracker's last reset_peak(). Then counts since the
/// process started, each a cause of a step slower than its prediction: `alloc_retries`, the
/// times the allocator freed its cache and tried again (it waits for the GPU to do so);
/// `device_allocs` and `device_frees`, its calls of cudaMalloc and cudaFree (each can wait for
/// the GPU; -1 before LibTorch 2.1).
struct CudaAllocatorStats {
  std::int64_t allocated = 0, allocated_peak = 0;
  std::int64_t requested = -1, requested_peak = -1;
  std::int64_t reserved = 0, reserved_peak = 0;
  std::int64_t alloc_retries = 0, device_allocs = -1, device_frees = -1;
};

/// The statistics above for a CUDA device. Throws c10::Error in a build without CUDA or where
/// no GPU is visible; c10::ValueError for another device type.
CudaAllocatorStats cuda_allocator_stats(c10::Device device);

/// Waits until the work queued on `device` is done (CUDA: every stream of that GPU; CPU:
/// nothing to wait for). Time measurements are taken between two synchronizations.
void synchronize(c10::Device device);

/// While alive, the CPU allocations of this thread are neither counted by the CPU tracker nor
/// limited: for the runtime's bookkeeping in host memory (a CPU generator's 5 KB state read to
/// be replayed), which is not activation memory.
class UncountedCpuAllocations {
 public:
  UncountedCpuAllocations();
  ~UncountedCpuAllocations();
  UncountedCpuAllocations(const UncountedCpuAllocations&) = delete;
  UncountedCpuAllocations& operator=(const UncountedCpuAllocations&) = delete;

 private:
  bool previous_;
};

/// Resets a tracker's peak on construction; peak_above_start() is then the largest growth
/// of live memory since, for measuring one operation.
class PeakScope {
 public:
  explicit PeakScope(MemoryTracker& tracker) : tracker_(tracker), start_(tracker.live()) {
    tracker_.reset_peak();
  }
  std::int64_t start() const { return start_; }
  std::int64_t peak_above_start() const { return tracker_.peak() - start_; }
  std::int64_t live_above_start() const { return tracker_.live() - start_; }

 private:
  MemoryTracker& tracker_;
  std::int64_t start_;
};

}  // namespace remat
