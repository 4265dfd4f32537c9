#pragma once
// The backends whose headers only some builds have: NCCL (nccl_backend.cpp in a build with
// CUDA and NCCL's headers, no_nccl.cpp otherwise).

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

#include "remat/distributed/group.h"

namespace remat::distributed::detail {

/// c10d's ProcessGroupNCCL on `store`; the caller has made the rank's GPU current.
Collectives make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                              std::chrono::milliseconds timeout);

}  // namespace remat::distributed::detail
