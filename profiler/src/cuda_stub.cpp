// The CUDA functions of a build whose LibTorch has no CUDA.
#include <stdexcept>

#include "detail.h"

namespace remat {
namespace detail {

MemoryTracker& cuda_memory_tracker(int /*device_index*/) {
  throw std::runtime_error(
      "remat: CUDA memory was asked for, but remat was built against a LibTorch without CUDA "
      "(rebuild against a CUDA LibTorch, see shared/gpu/README.md)");
}

}  // namespace detail
}  // namespace remat
