// NCCL, for a build against a LibTorch with CUDA where NCCL's headers were found.
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "backends.h"

namespace remat::distributed {

bool has_nccl() { return true; }

namespace detail {

Collectives make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                              std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return Collectives::of(c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options));
}

}  // namespace detail
}  // namespace remat::distributed
