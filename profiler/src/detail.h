#pragma once
// Internals of remat_profiler shared between its files. The CUDA functions are defined in
// cuda_memory_tracker.cpp when the LibTorch found has CUDA, else in cuda_stub.cpp: a CPU
// build includes no CUDA header.

#include <memory>
#include <vector>

#include "remat/core/cuda_intervals.h"
#include "remat/profiler/memory_tracker.h"

namespace remat {
namespace detail {

MemoryTracker& cpu_memory_tracker();
/// The CPU tracker's limit (limit_device_memory); installs the tracker.
void set_cpu_limit(std::int64_t bytes);
/// The caching allocator's statistics for a CUDA device (-1: the current one).
MemoryTracker& cuda_memory_tracker(int device_index);
/// The caching allocator's memory fraction for `bytes` of a CUDA device (0: the whole GPU).
void limit_cuda_memory(int device_index, std::int64_t bytes);
/// remat::cuda_allocator_stats for a CUDA device (-1: the current one).
CudaAllocatorStats cuda_allocator_stats(int device_index);
/// remat::exact_cuda_blocks.
bool exact_cuda_blocks();
/// Bytes a CUDA device (-1: the current one) can still hand out: free on the device, plus
/// what the caching allocator holds unallocated.
std::int64_t cuda_free_bytes(int device_index);

}  // namespace detail
}  // namespace remat
