#include <c10/core/CPUAllocator.h>

#include <catch2/catch.hpp>

#include <iostream>

#include "remat/profiler.h"
#include "skip.h"
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

TEST_CASE("CUDA memory in a build or on a machine without CUDA is a clear error", "[profiler]") {
  if (!remat::test::cuda_unavailable()) {
    std::cout << "REMAT_SKIP: a GPU is visible (the [cuda] tests cover it)" << std::endl;
    return;
  }
  CHECK_THROWS_AS(MemoryTracker::for_device(torch::Device(torch::kCUDA, 0)), c10::Error);
  CHECK_THROWS_WITH(MemoryTracker::for_device(torch::Device(torch::kCUDA, 0)), Catch::Contains("CUDA"));
  CHECK_THROWS_WITH(remat::limit_device_memory(torch::Device(torch::kCUDA, 0), 1 << 20),
                    Catch::Contains("CUDA"));
  CHECK_THROWS_WITH(remat::cuda_allocator_stats(torch::Device(torch::kCUDA, 0)),
                    Catch::Contains("CUDA"));
}

TEST_CASE("cuda_allocator_stats refuses a device that is not CUDA", "[profiler]") {
  CHECK_THROWS_AS(remat::cuda_allocator_stats(torch::kCPU), c10::ValueError);
  CHECK_THROWS_WITH(remat::cuda_allocator_stats(torch::kCPU),
                    Catch::Contains("cpu is not a CUDA device"));
}

TEST_CASE("cuda_allocator_stats: blocks as the tracker counts them, exact sizes, the cache",
          "[profiler][cuda]") {
  REMAT_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  MemoryTracker& tracker = MemoryTracker::for_device(cuda);
  const remat::CudaAllocatorStats before = remat::cuda_allocator_stats(cuda);
  CHECK(before.allocated == tracker.live());
  CHECK(before.reserved >= before.allocated);
  REQUIRE(before.requested >= 0);  // LibTorch 2.1 and later
  CHECK(before.requested <= before.allocated);
  tracker.reset_peak();
  {
    // 1000 bytes: a 1024-byte block of the small pool; 3 MiB + 4: a block of the large pool.
    torch::Tensor small = torch::empty({250}, torch::TensorOptions().device(cuda));
    torch::Tensor large = torch::empty({(3 << 18) + 1}, torch::TensorOptions().device(cuda));
    const remat::CudaAllocatorStats during = remat::cuda_allocator_stats(cuda);
    CHECK(during.allocated - before.allocated ==
          tracker.counted_bytes(1000) + tracker.counted_bytes((3 << 20) + 4));
    CHECK(during.requested - before.requested == 1000 + (3 << 20) + 4);
    CHECK(during.reserved >= during.allocated);
  }
  const remat::CudaAllocatorStats after = remat::cuda_allocator_stats(cuda);
  CHECK(after.allocated == before.allocated);
  CHECK(after.requested == before.requested);
  CHECK(after.allocated_peak == tracker.peak());
  CHECK(after.requested_peak - before.requested == 1000 + (3 << 20) + 4);
  CHECK(after.reserved_peak >= after.allocated_peak);
}

TEST_CASE("cuda_allocator_stats counts the allocator's calls of cudaMalloc", "[profiler][cuda]") {
  REMAT_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  const remat::CudaAllocatorStats before = remat::cuda_allocator_stats(cuda);
  REQUIRE(before.device_allocs >= 0);  // LibTorch 2.1 and later
  CHECK(before.device_frees >= 0);
  CHECK(before.alloc_retries >= 0);
  {
    // More than everything the cache holds: no cached segment can serve it.
    const std::int64_t bytes = before.reserved + (64 << 20);
    torch::Tensor big = torch::empty({bytes}, torch::TensorOptions().device(cuda).dtype(torch::kUInt8));
    CHECK(remat::cuda_allocator_stats(cuda).device_allocs > before.device_allocs);
  }
  // Served from the cache this time: the segment freed above is still held.
  const remat::CudaAllocatorStats cached = remat::cuda_allocator_stats(cuda);
  torch::Tensor again = torch::empty({64 << 20}, torch::TensorOptions().device(cuda).dtype(torch::kUInt8));
  CHECK(remat::cuda_allocator_stats(cuda).device_allocs == cached.device_allocs);
}

TEST_CASE("the CUDA tracker counts the caching allocator's blocks as counted_bytes says",
          "[profiler][cuda]") {
  REMAT_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  MemoryTracker& tracker = MemoryTracker::for_device(cuda);
  CHECK(tracker.device() == cuda);
  // Sizes around the allocator's boundaries: 512-byte blocks, the 1 MiB small pool, 10 MiB.
  for (const std::int64_t bytes : {std::int64_t{4}, std::int64_t{512}, std::int64_t{516},
                                   std::int64_t{1} << 20, (std::int64_t{1} << 20) + 4,
                                   std::int64_t{10} << 20, (std::int64_t{10} << 20) + 4}) {
    INFO(bytes << " bytes");
    const std::int64_t before = tracker.live();
    torch::Tensor a = torch::empty({bytes / 4}, torch::TensorOptions().device(cuda));
    CHECK(tracker.live() - before == tracker.counted_bytes(bytes));
    CHECK(tracker.peak() >= tracker.live());
  }
  tracker.reset_peak();
  CHECK(tracker.peak() == tracker.live());
}

TEST_CASE("counted_bytes: CUDA's 512-byte blocks, the CPU's granularity", "[profiler]") {
  const torch::Device cuda(torch::kCUDA, 0);
  CHECK(remat::counted_bytes(cuda, 0) == 0);
  CHECK(remat::counted_bytes(cuda, 1) == 512);
  CHECK(remat::counted_bytes(cuda, 4) == 512);
  CHECK(remat::counted_bytes(cuda, 512) == 512);
  CHECK(remat::counted_bytes(cuda, 513) == 1024);
  CHECK(remat::counted_bytes(cuda, (std::int64_t{3} << 30) + 1) == (std::int64_t{3} << 30) + 512);
  CHECK(remat::counted_bytes(torch::kCPU, 4) == 4);
  CHECK(remat::counted_bytes(torch::kCPU, 4001) == 4001);

  MemoryTracker& tracker = MemoryTracker::for_device(torch::kCPU);
  const std::int64_t before = tracker.live();
  torch::Tensor exact = torch::empty({3}, torch::kFloat32);
  {
    remat::test::CpuGranularity granularity(512);
    CHECK(remat::counted_bytes(torch::kCPU, 4) == 512);
    CHECK(tracker.counted_bytes(0) == 0);
    CHECK(tracker.counted_bytes(1000) == 1024);
    const std::int64_t mid = tracker.live();
    {
      torch::Tensor scalar = torch::zeros({}, torch::kFloat32);
      torch::Tensor odd = torch::empty({129}, torch::kFloat32);  // 516 bytes
      CHECK(tracker.live() - mid == 512 + 1024);
    }
    CHECK(tracker.live() == mid);
  }
  // Freed after the granularity changed back: what was counted is what is released.
  exact = torch::Tensor();
  CHECK(tracker.live() == before);
  CHECK_THROWS_AS(remat::set_cpu_granularity(0), c10::ValueError);
  CHECK_THROWS_AS(remat::set_cpu_granularity((1 << 20) + 1), c10::ValueError);
}

TEST_CASE("a CPU allocation beyond the limit, or one that fails, is an out-of-memory error",
          "[profiler]") {
  MemoryTracker& tracker = MemoryTracker::for_device(torch::kCPU);
  const std::int64_t before = tracker.live();
  {
    remat::test::CpuLimit limit(before + (1 << 20));
    torch::Tensor fits = torch::empty({1 << 17}, torch::kFloat32);  // 512 KiB
    try {
      torch::Tensor too_big = torch::empty({1 << 18}, torch::kFloat32);  // 1 MiB more
      FAIL("no error beyond the limit");
    } catch (const c10::OutOfMemoryError& error) {
      CHECK_THAT(error.what_without_backtrace(),
                 Catch::Contains("CPU out of memory") && Catch::Contains("above the limit") &&
                     Catch::Contains("REMAT_DEVICE_MEMORY_LIMIT"));
      CHECK_THAT(error.what_without_backtrace(),
                 Catch::Contains("tried to allocate 1.00 MiB (1048576 bytes)"));
    }
    // A small request beyond the limit says its size in a unit that fits, not "0 MiB".
    try {
      torch::Tensor more = torch::empty({1 << 17}, torch::kFloat32);  // 512 KiB: at the limit
      torch::Tensor small = torch::empty({100}, torch::kFloat32);
      FAIL("no error beyond the limit");
    } catch (const c10::OutOfMemoryError& error) {
      CHECK_THAT(error.what_without_backtrace(),
                 Catch::Contains("tried to allocate 400 B (400 bytes) with 1.00 MiB"));
    }
    CHECK(tracker.live() - before == (1 << 19));  // the refused allocation is not counted
  }
  CHECK_NOTHROW(torch::empty({1 << 18}, torch::kFloat32));  // lifted
  // A request the system cannot serve (1 PiB): LibTorch's plain error becomes an OOM error.
  CHECK_THROWS_AS(torch::empty({std::int64_t{1} << 48}, torch::kFloat32), c10::OutOfMemoryError);
  CHECK(tracker.live() == before);
  CHECK_THROWS_AS(remat::limit_device_memory(torch::kCPU, -1), c10::ValueError);
  CHECK_THROWS_AS(remat::limit_device_memory(torch::Device("meta"), 1), c10::ValueError);
}
