#pragma once
// The state of a device's default random generator, read and restored under the generator's
// lock (CUDA through LibTorch's hooks: no CUDA header needed). Used by the profiler to leave
// the random stream as it found it, and by the runtime to replay a stage's random numbers.

#include <c10/core/Device.h>
#include <torch/types.h>

namespace remat {

/// A copy of the default generator's state of `device` ("cuda" without index: the first GPU).
torch::Tensor generator_state(c10::Device device);
/// Sets the default generator of `device` to `state` (from generator_state()).
void set_generator_state(c10::Device device, const torch::Tensor& state);

}  // namespace remat
