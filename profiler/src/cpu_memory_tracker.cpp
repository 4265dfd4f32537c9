// The CPU tracking allocator: wraps the allocator that was active when it was installed and
// counts the bytes of every allocation it serves until its deleter runs.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "detail.h"
#include "remat/profiler/memory_tracker.h"

namespace remat {
namespace detail {
namespace {

// Each block is preceded by a header of kHeader bytes holding its size, so that the data
// pointer is also the context (raw_allocate requires it) and alignment is kept (64 bytes,
// LibTorch's CPU alignment).
constexpr std::size_t kHeader = 64;

// The counting, independent of the Allocator interface's version.
class Counter : public MemoryTracker {
 public:
  std::int64_t live() const override { return live_.load(std::memory_order_relaxed); }
  std::int64_t peak() const override { return peak_.load(std::memory_order_relaxed); }
  void reset_peak() override { peak_.store(live(), std::memory_order_relaxed); }
  c10::Device device() const override { return c10::Device(c10::kCPU); }

  void add(std::int64_t bytes) {
    const std::int64_t now = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    std::int64_t seen = peak_.load(std::memory_order_relaxed);
    while (now > seen && !peak_.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }
  void remove(std::int64_t bytes) { live_.fetch_sub(bytes, std::memory_order_relaxed); }

 private:
  std::atomic<std::int64_t> live_{0};
  std::atomic<std::int64_t> peak_{0};
};

c10::Allocator* g_inner = nullptr;
Counter g_counter;

void release(void* data) {
  if (data == nullptr) return;
  void* base = static_cast<char*>(data) - kHeader;
  g_counter.remove(static_cast<std::int64_t>(*static_cast<std::size_t*>(base)));
  g_inner->raw_deallocate(base);
}

c10::DataPtr allocate_tracked(std::size_t n) {
  void* base = g_inner->raw_allocate(n + kHeader);
  *static_cast<std::size_t*>(base) = n;
  void* data = static_cast<char*>(base) + kHeader;
  g_counter.add(static_cast<std::int64_t>(n));
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
    if (g_inner->raw_deleter() == nullptr)
      throw std::runtime_error(
          "remat: the active CPU allocator does not support raw allocation; cannot track "
          "CPU memory");
    // Never destroyed: tensors freed at exit still call its deleter.
    allocator = new TrackingCpuAllocator();
    c10::SetCPUAllocator(allocator, /*priority=*/200);
  });
  if (allocator == nullptr || c10::GetCPUAllocator() != allocator)
    throw std::runtime_error(
        "remat: the CPU memory tracker is not the active CPU allocator (another allocator was "
        "installed with a higher priority); CPU memory cannot be measured");
  return g_counter;
}

}  // namespace detail

MemoryTracker& MemoryTracker::for_device(c10::Device device) {
  if (device.is_cpu()) return detail::cpu_memory_tracker();
  if (device.is_cuda()) return detail::cuda_memory_tracker(device.has_index() ? device.index() : -1);
  throw std::invalid_argument("remat: no memory tracker for device " + device.str() +
                              " (cpu and cuda are supported)");
}

}  // namespace remat
