#include <c10/core/CPUAllocator.h>

#include <catch2/catch.hpp>

#include "remat/profiler.h"
#include "test_nets.h"

using remat::MemoryTracker;

TEST_CASE("the CPU tracker is the active allocator and counts storage bytes exactly",
          "[profiler]") {
  MemoryTracker& tracker = MemoryTracker::for_device(torch::kCPU);
  CHECK(tracker.device() == c10::Device(torch::kCPU));
  const std::int64_t before = tracker.live();
  {
    torch::Tensor a = torch::empty({1000}, torch::kFloat32);
    CHECK(tracker.live() - before == 4000);
    torch::Tensor view = a.view({10, 100});  // a view allocates nothing
    CHECK(tracker.live() - before == 4000);
    torch::Tensor b = torch::empty({3, 7}, torch::kFloat64);
    CHECK(tracker.live() - before == 4000 + 168);
  }
  CHECK(tracker.live() == before);
}

TEST_CASE("the CPU tracker counts raw_allocate and allocations made during backward",
          "[profiler]") {
  MemoryTracker& tracker = MemoryTracker::for_device(torch::kCPU);
  const std::int64_t before = tracker.live();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  void* raw = allocator->raw_allocate(12345);
  CHECK(tracker.live() - before == 12345);
  allocator->raw_deallocate(raw);
  CHECK(tracker.live() == before);

  torch::Tensor w = torch::randn({256, 256}, torch::requires_grad());
  torch::Tensor x = torch::randn({64, 256});
  torch::Tensor y = torch::mm(x, w).sum();
  const std::int64_t live = tracker.live();
  tracker.reset_peak();
  CHECK(tracker.peak() == live);
  y.backward();  // allocates w's gradient: 256 x 256 floats at least
  CHECK(tracker.peak() - live >= 256 * 256 * 4);
  CHECK(w.grad().defined());
}

TEST_CASE("PeakScope measures the growth of one operation", "[profiler]") {
  MemoryTracker& tracker = MemoryTracker::for_device(torch::kCPU);
  torch::Tensor keep;
  remat::PeakScope scope(tracker);
  {
    torch::Tensor temporary = torch::empty({500}, torch::kFloat32);  // 2000 bytes, freed
    keep = torch::empty({100}, torch::kFloat32);                      // 400 bytes, kept
  }
  CHECK(scope.live_above_start() == 400);
  CHECK(scope.peak_above_start() == 2400);
}

TEST_CASE("CUDA memory in a build or on a machine without CUDA is a clear error",
          "[profiler][cuda]") {
  if (REMAT_WITH_CUDA && torch::cuda::is_available()) {
    MemoryTracker& tracker = MemoryTracker::for_device(torch::Device(torch::kCUDA, 0));
    const std::int64_t before = tracker.live();
    torch::Tensor a = torch::empty({1 << 20}, torch::TensorOptions().device(torch::kCUDA));
    CHECK(tracker.live() - before == 4 << 20);
    tracker.reset_peak();
    CHECK(tracker.peak() == tracker.live());
    return;
  }
  try {
    MemoryTracker::for_device(torch::Device(torch::kCUDA, 0));
    FAIL("no error for CUDA without CUDA");
  } catch (const std::runtime_error& error) {
    CHECK_THAT(error.what(), Catch::Contains("CUDA"));
  }
}
