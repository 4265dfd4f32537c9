// GPU time between CUDA events (remat/core/cuda_intervals.h). Compiled only when the LibTorch
// found has CUDA; cuda_intervals_stub.cpp otherwise.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

#include "remat/core/cuda_device.h"
#include "remat/core/cuda_intervals.h"

namespace remat {
namespace detail {

struct CudaIntervals::Impl {
  c10::DeviceIndex index = 0;
  std::vector<cudaEvent_t> events;  // start, end, start, end, ...
  std::size_t marked = 0;

  void make(std::size_t count) {
    c10::cuda::CUDAGuard guard(index);
    while (events.size() < count) {
      cudaEvent_t event = nullptr;
      C10_CUDA_CHECK(cudaEventCreate(&event));
      events.push_back(event);
    }
  }
  void mark() {
    if (marked == events.size()) make(events.size() + 2);
    C10_CUDA_CHECK(cudaEventRecord(events[marked++], c10::cuda::getCurrentCUDAStream(index)));
  }
};

CudaIntervals::CudaIntervals(int device_index) : impl_(std::make_unique<Impl>()) {
  impl_->index = static_cast<c10::DeviceIndex>(checked_cuda_device(device_index, "timing"));
}

CudaIntervals::~CudaIntervals() {
  for (cudaEvent_t event : impl_->events) (void)cudaEventDestroy(event);  // never throws
}

void CudaIntervals::reserve(int count) {
  impl_->make(impl_->marked + 2 * static_cast<std::size_t>(std::max(count, 0)));
}

void CudaIntervals::begin() { impl_->mark(); }

void CudaIntervals::end() { impl_->mark(); }

double CudaIntervals::total_ms() {
  TORCH_INTERNAL_ASSERT(impl_->marked % 2 == 0, "remat: an interval begun was not ended");
  double total = 0;
  if (impl_->marked > 0) {
    C10_CUDA_CHECK(cudaEventSynchronize(impl_->events[impl_->marked - 1]));
    for (std::size_t k = 0; k < impl_->marked; k += 2) {
      float ms = 0;
      C10_CUDA_CHECK(cudaEventElapsedTime(&ms, impl_->events[k], impl_->events[k + 1]));
      total += ms;
    }
  }
  impl_->marked = 0;
  return total;
}

std::vector<double> CudaIntervals::gaps_ms() {
  std::vector<double> gaps;
  if (impl_->marked > 1) {
    C10_CUDA_CHECK(cudaEventSynchronize(impl_->events[impl_->marked - 1]));
    for (std::size_t k = 1; k < impl_->marked; ++k) {
      float ms = 0;
      C10_CUDA_CHECK(cudaEventElapsedTime(&ms, impl_->events[k - 1], impl_->events[k]));
      gaps.push_back(ms);
    }
  }
  impl_->marked = 0;
  return gaps;
}

}  // namespace detail
}  // namespace remat
