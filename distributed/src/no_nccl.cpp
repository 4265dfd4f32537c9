// A build without NCCL: Group::create refuses the nccl backend before it gets here.
#include "backends.h"
#include "remat/base/check.h"

namespace remat::distributed {

bool has_nccl() { return false; }

namespace detail {

Collectives make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int, int,
                              std::chrono::milliseconds) {
  REMAT_INTERNAL_ASSERT(false, "make_nccl_backend in a build without NCCL");
  return {};
}

}  // namespace detail
}  // namespace remat::distributed
