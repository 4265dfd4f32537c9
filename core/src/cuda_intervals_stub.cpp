// CudaIntervals in a build whose LibTorch has no CUDA: every function throws.
#include <c10/util/Exception.h>

#include <vector>

#include "remat/core/cuda_intervals.h"

namespace remat {
namespace detail {

namespace {
[[noreturn]] void no_cuda() {
  TORCH_CHECK(false,
              "remat: CUDA timing was asked for, but remat was built against a LibTorch without "
              "CUDA (rebuild against a CUDA LibTorch, see docs/building.md)");
}
}  // namespace

struct CudaIntervals::Impl {};
CudaIntervals::CudaIntervals(int /*device_index*/) { no_cuda(); }
CudaIntervals::~CudaIntervals() = default;
void CudaIntervals::reserve(int /*count*/) { no_cuda(); }
void CudaIntervals::begin() { no_cuda(); }
void CudaIntervals::end() { no_cuda(); }
double CudaIntervals::total_ms() { no_cuda(); }
std::vector<double> CudaIntervals::gaps_ms() { no_cuda(); }

}  // namespace detail
}  // namespace remat
