#pragma once
// Small chains for the LibTorch tests: the layer kinds of the ported models (Conv, BatchNorm,
// ReLU, pooling, Linear, Dropout), a batch of a few samples.
#include <torch/torch.h>

#include "remat/core/block.h"
#include "remat/profiler/memory_tracker.h"

namespace remat::test {

namespace nn = torch::nn;

// Conv+BN+ReLU stages, a pooling stage, a classifier stage with flatten. The classifier pools
// to `pooled` x `pooled`: 1 on a GPU under deterministic algorithms, where adaptive average
// pooling to more than one value has no deterministic backward (1 is a mean, which has).
inline nn::Sequential conv_chain(int channels = 8, int classes = 10, bool dropout = false,
                                 int pooled = 2) {
  nn::Sequential net;
  net->push_back(remat::Block(nn::Conv2d(nn::Conv2dOptions(3, channels, 3).padding(1).bias(false)),
                                nn::BatchNorm2d(channels), nn::ReLU()));
  net->push_back(remat::Block(
      nn::Conv2d(nn::Conv2dOptions(channels, channels, 3).padding(1).bias(false)),
      nn::BatchNorm2d(channels), nn::ReLU()));
  net->push_back(nn::MaxPool2d(nn::MaxPool2dOptions(2)));
  net->push_back(remat::Block(
      nn::Conv2d(nn::Conv2dOptions(channels, 2 * channels, 3).padding(1).bias(false)),
      nn::BatchNorm2d(2 * channels), nn::ReLU()));
  if (dropout) net->push_back(nn::Dropout(0.3));
  net->push_back(remat::Block(nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions({pooled, pooled})),
                              nn::Flatten(), nn::Linear(2 * channels * pooled * pooled, classes)));
  return net;
}

// Every parameter and buffer, flattened into one list (for before/after comparisons).
inline std::vector<torch::Tensor> state_of(const nn::Module& net) {
  std::vector<torch::Tensor> out;
  for (const auto& p : net.parameters()) out.push_back(p.detach().clone());
  for (const auto& b : net.buffers()) out.push_back(b.clone());
  return out;
}

inline bool same_tensors(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!a[i].sizes().equals(b[i].sizes()) || !torch::equal(a[i], b[i])) return false;
  return true;
}

}  // namespace remat::test

namespace remat::test {

/// Counts CPU allocations in units of `granularity` bytes while alive (512: CUDA's caching
/// allocator), so that CUDA's accounting is exercised on the CPU.
class CpuGranularity {
 public:
  explicit CpuGranularity(std::int64_t granularity)
      : previous_(remat::set_cpu_granularity(granularity)) {}
  ~CpuGranularity() { remat::set_cpu_granularity(previous_); }
  CpuGranularity(const CpuGranularity&) = delete;
  CpuGranularity& operator=(const CpuGranularity&) = delete;

 private:
  std::int64_t previous_;
};

/// A CPU that refuses allocations beyond `bytes` of live tracked memory while alive.
class CpuLimit {
 public:
  explicit CpuLimit(std::int64_t bytes) { remat::limit_device_memory(torch::kCPU, bytes); }
  ~CpuLimit() { remat::limit_device_memory(torch::kCPU, 0); }
  CpuLimit(const CpuLimit&) = delete;
  CpuLimit& operator=(const CpuLimit&) = delete;
};

}  // namespace remat::test
