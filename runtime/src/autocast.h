#pragma once
// The autocast state of the calling thread (internal): captured at a step's forward, and set
// again while the backward recomputes, as torch.utils.checkpoint does. Without it a stage
// recomputed after the caller left `torch.autocast` runs in float32 where its first forward
// ran in bfloat16 or float16: other values, other gradients, and other memory than planned.
#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace remat::detail {

class AutocastState {
 public:
  static AutocastState capture() {
    AutocastState s;
    s.cpu_ = enabled(at::kCPU);
    s.cuda_ = enabled(at::kCUDA);
    s.cpu_dtype_ = dtype(at::kCPU);
    s.cuda_dtype_ = dtype(at::kCUDA);
    s.cache_ = at::autocast::is_autocast_cache_enabled();
    return s;
  }

  bool any() const { return cpu_ || cuda_; }
  /// Whether autocast is on for device type `d` (the CPU or CUDA), and its dtype.
  bool on(at::DeviceType d) const { return d == at::kCUDA ? cuda_ : cpu_; }
  at::ScalarType type(at::DeviceType d) const { return d == at::kCUDA ? cuda_dtype_ : cpu_dtype_; }

 private:
  friend class AutocastGuard;
  // PyTorch 2.4 replaced the per-device functions by ones taking the device type, and
  // deprecated the old ones (each call warns).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  static bool enabled(at::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
  static at::ScalarType dtype(at::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
  static void set(at::DeviceType d, bool on, at::ScalarType type) {
    at::autocast::set_autocast_enabled(d, on);
    at::autocast::set_autocast_dtype(d, type);
  }
#else
  static bool enabled(at::DeviceType d) {
    return d == at::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
  }
  static at::ScalarType dtype(at::DeviceType d) {
    return d == at::kCPU ? at::autocast::get_autocast_cpu_dtype()
                         : at::autocast::get_autocast_gpu_dtype();
  }
  static void set(at::DeviceType d, bool on, at::ScalarType type) {
    if (d == at::kCPU) {
      at::autocast::set_cpu_enabled(on);
      at::autocast::set_autocast_cpu_dtype(type);
    } else {
      at::autocast::set_enabled(on);
      at::autocast::set_autocast_gpu_dtype(type);
    }
  }
#endif
  static void apply(const AutocastState& s) {
    set(at::kCPU, s.cpu_, s.cpu_dtype_);
    set(at::kCUDA, s.cuda_, s.cuda_dtype_);
    at::autocast::set_autocast_cache_enabled(s.cache_);
  }

  bool cpu_ = false;
  bool cuda_ = false;
  at::ScalarType cpu_dtype_ = at::kBFloat16;
  at::ScalarType cuda_dtype_ = at::kHalf;
  bool cache_ = true;
};

/// Makes `s` the thread's autocast state for its lifetime, as `with torch.autocast(...)`
/// does: one level of nesting, so that leaving the outermost level clears the cache of cast
/// weights (a weight the optimizer then updates must not be served from it at the next step).
class AutocastGuard {
 public:
  explicit AutocastGuard(const AutocastState& s) : previous_(AutocastState::capture()) {
    AutocastState::apply(s);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    AutocastState::apply(previous_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState previous_;
};

}  // namespace remat::detail
