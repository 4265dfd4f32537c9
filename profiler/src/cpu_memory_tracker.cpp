// The CPU tracking allocator: wraps the allocator that was active when it was installed and
// counts the bytes of every allocation it serves until its deleter runs. It also turns the
// CPU's allocation failures into c10::OutOfMemoryError (LibTorch raises a plain c10::Error
// there), so that callers handle running out of memory alike on every device, and can emulate
// CUDA's accounting (granularity) and a smaller device (limit) for tests.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <string>
#include <type_traits>

#include "detail.h"
#include "remat/base/units.h"
#include "remat/profiler/memory_tracker.h"

namespace remat {
namespace detail {
namespace {

// Each block is preceded by a header of kHeader bytes holding the bytes it was counted as, so
// that the data pointer is also the context (raw_allocate requires it) and alignment is kept
// (64 bytes, LibTorch's CPU alignment).
constexpr std::size_t kHeader = 64;
constexpr std::int64_t kMaxGranularity = std::int64_t{1} << 20;

// The counting, independent of the Allocator interface's version.
class Counter : public MemoryTracker {
 public:
  std::int64_t live() const override { return live_.load(std::memory_order_relaxed); }
  std::int64_t peak() const override { return peak_.load(std::memory_order_relaxed); }
  void reset_peak() override { peak_.store(live(), std::memory_order_relaxed); }
  bool raise_peak(std::int64_t bytes) override {
    std::int64_t seen = peak_.load(std::memory_order_relaxed);
    while (bytes > seen && !peak_.compare_exchange_weak(seen, bytes, std::memory_order_relaxed)) {
    }
    return true;
  }
  c10::Device device() const override { return c10::Device(c10::kCPU); }

  // Adds `bytes` unless live would exceed `limit` (0: no limit); returns whether it did.
  bool add(std::int64_t bytes, std::int64_t limit) {
    const std::int64_t now = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    if (limit > 0 && now > limit) {
      remove(bytes);
      return false;
    }
    std::int64_t seen = peak_.load(std::memory_order_relaxed);
    while (now > seen && !peak_.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
    return true;
  }
  void remove(std::int64_t bytes) { live_.fetch_sub(bytes, std::memory_order_relaxed); }

 private:
  std::atomic<std::int64_t> live_{0};
  std::atomic<std::int64_t> peak_{0};
};

c10::Allocator* g_inner = nullptr;
Counter g_counter;
std::atomic<std::int64_t> g_granularity{1};
std::atomic<std::int64_t> g_limit{0};

// "12.06 KiB (12345 bytes)": a small allocation is not "0 MiB".
std::string mib(std::int64_t bytes) {
  return format_bytes(bytes) + " (" + std::to_string(bytes) + " bytes)";
}

void release(void* data) {
  if (data == nullptr) return;
  void* base = static_cast<char*>(data) - kHeader;
  g_counter.remove(*static_cast<std::int64_t*>(base));
  g_inner->raw_deallocate(base);
}

thread_local bool t_uncounted = false;

c10::DataPtr allocate_tracked(std::size_t n) {
  // Uncounted: the header says 0, so that the release subtracts nothing either.
  const std::int64_t counted =
      t_uncounted ? 0 : counted_bytes(c10::Device(c10::kCPU), static_cast<std::int64_t>(n));
  const std::int64_t limit = g_limit.load(std::memory_order_relaxed);
  TORCH_CHECK_WITH(OutOfMemoryError, g_counter.add(counted, limit),
                   "CPU out of memory: tried to allocate ", mib(counted), " with ",
                   mib(g_counter.live()), " in use, above the limit of ", mib(limit),
                   " set by remat::limit_device_memory (REMAT_DEVICE_MEMORY_LIMIT)");
  void* base = nullptr;
  try {
    base = g_inner->raw_allocate(n + kHeader);
  } catch (const c10::Error&) {
    g_counter.remove(counted);
    // LibTorch's message adds only its source line. Say when no machine of this size could do
    // it (`--batch 100000000`), where a smaller budget cannot help.
    const long pages = sysconf(_SC_PHYS_PAGES);
    const std::int64_t physical = pages > 0 ? pages * std::int64_t{sysconf(_SC_PAGE_SIZE)} : 0;
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: tried to allocate ", mib(counted),
                     " with ", mib(g_counter.live()), " in use",
                     physical > 0 && counted > physical
                         ? ", more than this machine's " + mib(physical) + " of memory"
                         : std::string());
  }
  *static_cast<std::int64_t*>(base) = counted;
  void* data = static_cast<char*>(base) + kHeader;
  return {data, data, &release, c10::Device(c10::kCPU)};
}

// LibTorch 2.3 made Allocator::allocate non-const and added a pure copy_data; the layers
// below declare whichever the LibTorch found has (detected, not version-guessed).
constexpr bool kConstAllocate =
    std::is_same<decltype(&c10::Allocator::allocate),
                 c10::DataPtr (c10::Allocator::*)(std::size_t) const>::value;
template <class T, class = void>
struct HasCopyData : std::false_type {};
template <class T>
struct HasCopyData<T, std::void_t<decltype(&T::copy_data)>> : std::true_type {};

template <class Base, bool kConst>
struct AllocateLayer : Base {
  c10::DataPtr allocate(std::size_t n) override { return allocate_tracked(n); }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
};
template <class Base>
struct AllocateLayer<Base, true> : Base {
  c10::DataPtr allocate(std::size_t n) const override { return allocate_tracked(n); }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
};
template <class Base, bool kCopy>
struct CopyLayer : Base {};
template <class Base>
struct CopyLayer<Base, true> : Base {
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    this->default_copy_data(dest, src, count);
  }
};
using TrackingCpuAllocator =
    CopyLayer<AllocateLayer<c10::Allocator, kConstAllocate>, HasCopyData<c10::Allocator>::value>;

}  // namespace

MemoryTracker& cpu_memory_tracker() {
  static TrackingCpuAllocator* allocator = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    g_inner = c10::GetCPUAllocator();
    TORCH_CHECK(g_inner->raw_deleter() != nullptr,
                "remat: the active CPU allocator does not support raw allocation; cannot track "
                "CPU memory");
    // Never destroyed: tensors freed at exit still call its deleter.
    allocator = new TrackingCpuAllocator();
    c10::SetCPUAllocator(allocator, /*priority=*/200);
  });
  TORCH_CHECK(allocator != nullptr && c10::GetCPUAllocator() == allocator,
              "remat: the CPU memory tracker is not the active CPU allocator (another allocator "
              "was installed with a higher priority); CPU memory cannot be measured");
  return g_counter;
}

void set_cpu_limit(std::int64_t bytes) {
  cpu_memory_tracker();  // the limit is enforced by the tracking allocator
  g_limit.store(bytes);
}

}  // namespace detail

UncountedCpuAllocations::UncountedCpuAllocations() : previous_(detail::t_uncounted) {
  detail::t_uncounted = true;
}
UncountedCpuAllocations::~UncountedCpuAllocations() { detail::t_uncounted = previous_; }

std::int64_t counted_bytes(c10::Device device, std::int64_t nbytes) {
  if (nbytes <= 0) return 0;
  // CUDA's caching allocator rounds every block up to kMinBlockSize (512 bytes).
  const std::int64_t granularity =
      device.is_cuda() ? 512 : detail::g_granularity.load(std::memory_order_relaxed);
  return (nbytes + granularity - 1) / granularity * granularity;
}

std::int64_t set_cpu_granularity(std::int64_t granularity) {
  TORCH_CHECK_VALUE(granularity >= 1 && granularity <= detail::kMaxGranularity,
                    "remat::set_cpu_granularity: ", granularity, " is not between 1 and ",
                    detail::kMaxGranularity, " bytes");
  return detail::g_granularity.exchange(granularity);
}

std::int64_t MemoryTracker::counted_bytes(std::int64_t nbytes) const {
  return remat::counted_bytes(device(), nbytes);
}

MemoryTracker& MemoryTracker::for_device(c10::Device device) {
  if (device.is_cpu()) return detail::cpu_memory_tracker();
  if (device.is_cuda()) return detail::cuda_memory_tracker(device.has_index() ? device.index() : -1);
  TORCH_CHECK_VALUE(false, "remat: no memory tracker for device ", device.str(),
                    " (cpu and cuda are supported)");
}

}  // namespace remat
