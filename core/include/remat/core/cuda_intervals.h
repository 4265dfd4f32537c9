#pragma once
// Internal: GPU time between CUDA events, shared by the profiler (stage times) and the
// runtime (traced steps). Defined in core/src/cuda_intervals.cpp when the LibTorch found has
// CUDA, else in cuda_intervals_stub.cpp, whose functions throw: a CPU build includes no CUDA
// header.

#include <memory>
#include <vector>

namespace remat {
namespace detail {

/// GPU time on a CUDA device's current stream between marks that do not stop the host (CUDA
/// events): a stage timed back to back, the host queueing the next repetition while the GPU
/// runs this one, costs what it costs within a step. Timed from the host between two
/// synchronizations, each repetition also counted the launch of its first kernels and the
/// synchronization's latency, which a step hides: on an H200 that made the predicted makespan
/// of plain training 12-56% longer than its measured step, for networks of 11 to 103 stages.
class CudaIntervals {
 public:
  /// -1: the current device.
  explicit CudaIntervals(int device_index);
  ~CudaIntervals();
  CudaIntervals(const CudaIntervals&) = delete;
  CudaIntervals& operator=(const CudaIntervals&) = delete;
  /// Makes the events of `count` intervals now, so that none is made while timing.
  void reserve(int count);
  /// Marks the start of an interval on the stream.
  void begin();
  /// Marks its end.
  void end();
  /// Waits for the last mark; the sum of the intervals marked since the last call, in ms.
  double total_ms();
  /// Waits for the last mark; the times between consecutive marks (begin and end alike) made
  /// since the last call, in ms: the GPU's timeline cut at each mark.
  std::vector<double> gaps_ms();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace detail
}  // namespace remat
