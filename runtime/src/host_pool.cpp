#include "host_pool.h"

#include <algorithm>

namespace remat::detail {

torch::Tensor HostPool::Block::bytes(std::int64_t count) const {
  if (pinned.defined()) return pinned.narrow(0, 0, count);
  // A view of memory LibTorch did not allocate: no storage is counted for it.
  return torch::from_blob(cpu.get(), {count}, torch::TensorOptions().dtype(torch::kByte));
}

HostPool::Lease HostPool::take(std::int64_t bytes, bool pinned) {
  const std::int64_t size = std::max<std::int64_t>(bytes, 1);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& idle = pinned ? idle_pinned_ : idle_cpu_;
    const auto found = idle.lower_bound(size);
    if (found != idle.end()) {
      Lease block = std::move(found->second);
      idle.erase(found);
      block->used = bytes;
      stats_.in_use_bytes += bytes;
      stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.in_use_bytes);
      return block;
    }
  }
  auto block = std::make_unique<Block>();
  block->capacity = size;
  if (pinned)
    block->pinned = torch::empty({size}, torch::TensorOptions().dtype(torch::kByte).pinned_memory(true));
  else
    block->cpu.reset(new char[static_cast<std::size_t>(size)]);
  block->used = bytes;
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.in_use_bytes += bytes;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.in_use_bytes);
  stats_.held_bytes += size;
  ++stats_.blocks;
  return block;
}

void HostPool::give_back(Lease block) {
  if (!block) return;
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.in_use_bytes -= block->used;
  block->used = 0;
  const std::int64_t capacity = block->capacity;
  (block->pinned.defined() ? idle_pinned_ : idle_cpu_).emplace(capacity, std::move(block));
}

void HostPool::free_idle() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto* idle : {&idle_cpu_, &idle_pinned_}) {
    for (const auto& entry : *idle) stats_.held_bytes -= entry.second->capacity;
    idle->clear();
  }
}

HostPool::Stats HostPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void HostPool::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_bytes = stats_.in_use_bytes;
}

}  // namespace remat::detail
