#pragma once
// Tests that cannot run on this machine say so and end: CTest reports them as skipped (the
// tests' SKIP_REGULAR_EXPRESSION, tests/CMakeLists.txt), never as passed.
//
//   TEST_CASE("...", "[runtime][cuda]") {
//     REMAT_REQUIRE_CUDA();
//     ...
//   }

#include <torch/cuda.h>

#include <iostream>

#include "remat/config.h"

namespace remat::test {

/// Why a CUDA test cannot run here, or nullptr when it can.
inline const char* cuda_unavailable() {
  if (!REMAT_WITH_CUDA) return "remat was built against a LibTorch without CUDA";
  if (!torch::cuda::is_available()) return "no CUDA GPU is visible";
  return nullptr;
}

}  // namespace remat::test

/// Ends the test, reported as skipped, unless a CUDA GPU can be used.
#define REMAT_REQUIRE_CUDA()                                                              \
  do {                                                                                    \
    if (const char* why_ = ::remat::test::cuda_unavailable()) {                           \
      std::cout << "REMAT_SKIP: " << why_ << std::endl;                                   \
      return;                                                                             \
    }                                                                                     \
  } while (false)
