// The CUDA functions of a build whose LibTorch has no CUDA.
#include <c10/util/Exception.h>

#include "detail.h"

namespace remat {
namespace detail {

namespace {
[[noreturn]] void no_cuda() {
  TORCH_CHECK(false,
              "remat: CUDA memory was asked for, but remat was built against a LibTorch without "
              "CUDA (rebuild against a CUDA LibTorch, see docs/building.md)");
}
}  // namespace

MemoryTracker& cuda_memory_tracker(int /*device_index*/) { no_cuda(); }
void limit_cuda_memory(int /*device_index*/, std::int64_t /*bytes*/) { no_cuda(); }
std::int64_t cuda_free_bytes(int /*device_index*/) { no_cuda(); }
CudaAllocatorStats cuda_allocator_stats(int /*device_index*/) { no_cuda(); }
bool exact_cuda_blocks() { return false; }

}  // namespace detail
}  // namespace remat
