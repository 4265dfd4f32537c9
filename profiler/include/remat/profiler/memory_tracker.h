#pragma once
// Bytes of tensor storage, live and peak, on one device: what the cost model calls memory.
//
// CPU: a tracking allocator installed process-wide over LibTorch's default CPU allocator
// (c10::SetCPUAllocator with a higher priority). It counts every storage allocated through
// c10::GetCPUAllocator() after it is installed, including those made during backward and by
// raw_allocate, never process RSS. CUDA: the caching allocator's allocated-bytes statistics
// (compiled only when the LibTorch found has CUDA; see REMAT_WITH_CUDA).
//
//   remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(torch::kCPU);
//   tracker.reset_peak();
//   auto y = net->forward(x);
//   std::int64_t peak_activation_bytes = tracker.peak() - baseline;

#include <c10/core/Device.h>

#include <cstdint>

#ifndef REMAT_WITH_CUDA
#define REMAT_WITH_CUDA 0
#endif

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
  virtual c10::Device device() const = 0;

  /// The tracker of a device. For the CPU this installs the tracking allocator on first use
  /// and checks that it is the active one; tensors allocated before then are not counted.
  /// Throws std::runtime_error for CUDA in a build without CUDA, or if another CPU allocator
  /// with a higher priority replaced ours.
  static MemoryTracker& for_device(c10::Device device);
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
