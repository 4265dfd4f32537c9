// Device-level helpers of memory_tracker.h that are the same for every tracker.
#include <torch/cuda.h>

#include <string>

#include "detail.h"
#include "remat/profiler/memory_tracker.h"

namespace remat {

void limit_device_memory(c10::Device device, std::int64_t bytes) {
  TORCH_CHECK_VALUE(bytes >= 0, "remat::limit_device_memory: a negative size (", bytes, " bytes)");
  if (device.is_cpu()) return detail::set_cpu_limit(bytes);
  if (device.is_cuda()) return detail::limit_cuda_memory(device.has_index() ? device.index() : -1, bytes);
  TORCH_CHECK_VALUE(false, "remat::limit_device_memory: no memory limit for device ", device.str(),
                    " (cpu and cuda are supported)");
}

CudaAllocatorStats cuda_allocator_stats(c10::Device device) {
  TORCH_CHECK_VALUE(device.is_cuda(), "remat::cuda_allocator_stats: ", device.str(),
                    " is not a CUDA device");
  return detail::cuda_allocator_stats(device.has_index() ? device.index() : -1);
}

bool exact_cuda_blocks() { return detail::exact_cuda_blocks(); }

void synchronize(c10::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

}  // namespace remat
