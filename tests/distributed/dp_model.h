#pragma once
// The network, data and training step shared by the data-parallel worker (dp_worker.cpp) and
// the single-process reference in distributed_test.cpp.

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace remat::test {

inline constexpr int kDpBatch = 64;
inline constexpr int kDpFeatures = 16;
inline constexpr double kDpLearningRate = 0.1;

/// A chain of 8 stages; its initial weights depend on `seed` (each rank starts from its own,
/// so that the broadcast from rank 0 is tested).
inline torch::nn::Sequential dp_network(std::uint64_t seed, int hidden = 32) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(
      torch::nn::Linear(kDpFeatures, hidden), torch::nn::Tanh(), torch::nn::Linear(hidden, hidden),
      torch::nn::ReLU(), torch::nn::Linear(hidden, hidden), torch::nn::Tanh(),
      torch::nn::Linear(hidden, hidden), torch::nn::Linear(hidden, 4));
}

/// Rank `rank`'s batch at `step`: its own data, as a data-parallel job's sampler gives.
inline std::pair<torch::Tensor, torch::Tensor> dp_batch(int rank, int step) {
  torch::manual_seed(static_cast<std::uint64_t>(1000 * rank + step + 1));
  torch::Tensor x = torch::randn({kDpBatch, kDpFeatures});
  torch::Tensor y = torch::randn({kDpBatch, 4});
  return {x, y};
}

inline torch::Tensor dp_loss(const torch::Tensor& out, const torch::Tensor& target) {
  return torch::mse_loss(out, target);
}

}  // namespace remat::test
