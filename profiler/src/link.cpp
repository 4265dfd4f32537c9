#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "remat/core/error.h"
#include "remat/profiler/profiler.h"

namespace remat {
namespace {

using Clock = std::chrono::steady_clock;

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

Link measure_link(c10::Device device, std::int64_t bytes, int repeat) {
  TORCH_CHECK_VALUE(device.is_cpu() || device.is_cuda(),
                    "remat::measure_link: a CPU or CUDA device, not ", device.str());
  TORCH_CHECK_VALUE(bytes >= (std::int64_t{1} << 20) && bytes <= (std::int64_t{1} << 32),
                    "remat::measure_link: bytes must be from 1 MiB to 4 GiB, got ", bytes);
  TORCH_CHECK_VALUE(repeat >= 1 && repeat <= kMaxProfileRepeat,
                    "remat::measure_link: repeat must be from 1 to ", kMaxProfileRepeat, ", got ",
                    repeat);
  c10::OptionalDeviceGuard device_guard;
  if (device.is_cuda()) device_guard.reset_device(device);
  // The host side as the runtime's copies have it (runtime/src/host_pool.h): pinned memory on a
  // GPU, plain memory outside LibTorch's allocator on the CPU; the device side a tensor on it.
  const auto byte_options = torch::TensorOptions().dtype(torch::kByte);
  std::unique_ptr<char[]> plain;
  torch::Tensor host;
  if (device.is_cuda()) {
    host = torch::empty({bytes}, byte_options.pinned_memory(true));
  } else {
    plain.reset(new char[static_cast<std::size_t>(bytes)]);
    host = torch::from_blob(plain.get(), {bytes}, byte_options);
  }
  host.fill_(1);
  const torch::Tensor on_device = torch::ones({bytes}, byte_options.device(device));
  // Copies on a stream of their own, as the runtime's (the CPU's copies run on the host).
  std::optional<c10::StreamGuard> copy_stream;
  if (device.is_cuda())
    copy_stream.emplace(c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device));
  // Each measurement: `count` copies of `size` bytes one way, back to back, between two
  // synchronizations; milliseconds per copy.
  const auto per_copy_ms = [&](bool to_host, std::int64_t size, int count) {
    const torch::Tensor from = (to_host ? on_device : host).narrow(0, 0, size);
    const torch::Tensor to = (to_host ? host : on_device).narrow(0, 0, size);
    synchronize(device);
    const auto start = Clock::now();
    for (int k = 0; k < count; ++k) to.copy_(from, /*non_blocking=*/device.is_cuda());
    synchronize(device);
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count() / count;
  };
  constexpr std::int64_t kSmall = 4096;
  constexpr int kSmallCopies = 64;
  Link link;
  std::vector<double> latency, out_ms, back_ms;
  per_copy_ms(true, bytes, 1);  // warm-up: the first copies map pages and start the engines
  per_copy_ms(false, bytes, 1);
  for (int r = 0; r < repeat; ++r) {
    latency.push_back(0.5 * (per_copy_ms(true, kSmall, kSmallCopies) +
                             per_copy_ms(false, kSmall, kSmallCopies)));
    out_ms.push_back(per_copy_ms(true, bytes, 1));
    back_ms.push_back(per_copy_ms(false, bytes, 1));
  }
  link.latency_ms = median_of(latency);
  // A copy of `bytes` takes latency + bytes / bandwidth: the bandwidth from what is left.
  const auto gbps = [&](double ms) {
    const double seconds = std::max(ms - link.latency_ms, 1e-6) / 1e3;
    return std::clamp(static_cast<double>(bytes) / seconds / 1e9, kMinLinkGbps, kMaxLinkGbps);
  };
  link.d2h_gbps = gbps(median_of(out_ms));
  link.h2d_gbps = gbps(median_of(back_ms));
  return link;
}

}  // namespace remat
