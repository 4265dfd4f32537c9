#pragma once
// Internals of remat_profiler shared between its files. The CUDA functions are defined in
// cuda_memory_tracker.cpp when the LibTorch found has CUDA, else in cuda_stub.cpp: a CPU
// build includes no CUDA header.

#include "remat/profiler/memory_tracker.h"

namespace remat {
namespace detail {

MemoryTracker& cpu_memory_tracker();
/// The caching allocator's statistics for a CUDA device (-1: the current one).
MemoryTracker& cuda_memory_tracker(int device_index);

}  // namespace detail
}  // namespace remat
