#include "remat/core/generator_state.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>

#include <mutex>

namespace remat {

namespace {
at::Generator default_generator(c10::Device device) {
  // A tensor's device always has an index; a bare "cuda" means the first GPU here.
  if (device.is_cuda() && !device.has_index()) device = c10::Device(c10::kCUDA, 0);
  return at::globalContext().defaultGenerator(device);
}
}  // namespace

torch::Tensor generator_state(c10::Device device) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(c10::Device device, const torch::Tensor& state) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace remat
