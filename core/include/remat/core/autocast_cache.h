#pragma once
// Autocast's cache of cast weights around a stage's forward (internal).
#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>
#include <torch/version.h>

namespace remat::detail {

#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 2)
// Before PyTorch 2.2 (pytorch/pytorch#65766, fixed by #113685), autocast cached a weight's cast
// made without autograd and served it to a later forward with autograd in the same autocast
// region: that forward's output had no path back to the weight, whose gradient was then lost
// (or, for a stage whose only parameters these are, its output did not require grad at all).
// remat runs stages without autograd (Fn, and the profiler's measurements) and with it in one
// region. On those versions a forward without autograd neither reads nor fills the cache; from
// 2.2 on, autocast itself casts again where the cached cast lacks the history.
inline constexpr bool kAutocastCacheKeepsCastsWithoutGrad = true;
#else
inline constexpr bool kAutocastCacheKeepsCastsWithoutGrad = false;
#endif

/// Around one stage's forward: the cache of autocast's casts left out while autograd is off,
/// where the LibTorch serves such casts to forwards with autograd (above). Nothing otherwise.
class ForwardCastCache {
 public:
  ForwardCastCache() {
    if (kAutocastCacheKeepsCastsWithoutGrad && !c10::GradMode::is_enabled() &&
        at::autocast::is_autocast_cache_enabled()) {
      at::autocast::set_autocast_cache_enabled(false);
      restore_ = true;
    }
  }
  ~ForwardCastCache() {
    if (restore_) at::autocast::set_autocast_cache_enabled(true);
  }
  ForwardCastCache(const ForwardCastCache&) = delete;
  ForwardCastCache& operator=(const ForwardCastCache&) = delete;

 private:
  bool restore_ = false;
};

}  // namespace remat::detail
