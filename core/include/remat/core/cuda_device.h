#pragma once
// Internal: the CUDA device a caller names, checked once for the profiler's memory tracker and
// CudaIntervals alike. Defined in core/src/cuda_device.cpp, compiled only where the LibTorch
// found has CUDA.

namespace remat {
namespace detail {

/// The index of the CUDA device `device_index` names (-1: the current device). Throws
/// c10::Error "remat: CUDA <asked_for> was asked for, but no GPU is visible" when there is no
/// GPU, and c10::ValueError naming the index and the count when the index is past the last.
int checked_cuda_device(int device_index, const char* asked_for);

}  // namespace detail
}  // namespace remat
