#include "remat/core/cuda_device.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

namespace remat {
namespace detail {

int checked_cuda_device(int device_index, const char* asked_for) {
  TORCH_CHECK(c10::cuda::device_count() > 0, "remat: CUDA ", asked_for,
              " was asked for, but no GPU is visible");
  const int index = device_index < 0 ? c10::cuda::current_device() : device_index;
  TORCH_CHECK_VALUE(index < c10::cuda::device_count(), "remat: no CUDA device ", index, " (",
                    static_cast<int>(c10::cuda::device_count()), " visible)");
  return index;
}

}  // namespace detail
}  // namespace remat
