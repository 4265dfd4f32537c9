#pragma once
// The network, data and training step shared by the data-parallel worker (dp_worker.cpp) and
// the single-process reference in distributed_test.cpp.

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace remat::test {

inline constexpr int kDpBatch = 64;
inline constexpr int kDpFeatures = 16;
inline constexpr double kDpLearningRate = 0.1;

/// A stage that maps hidden features back to kDpFeatures with the transpose of another
/// Linear's weight, which it holds without registering: that weight is tied to two stages (as
/// GPT-2's embedding and head) and receives its gradient twice in each backward.
struct TiedTransposeImpl : torch::nn::Module {
  explicit TiedTransposeImpl(torch::nn::Linear tied) : linear(std::move(tied)) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::linear(x, linear->weight.t()); }
  torch::nn::Linear linear;  // not registered: its owner's parameter
};
TORCH_MODULE(TiedTranspose);

/// A chain of 10 stages, with a BatchNorm (its running statistics are buffers) and a weight
/// tied to two stages; its initial weights and buffers depend on `seed` (each rank starts from
/// its own, so that the broadcast from rank 0 is tested).
inline torch::nn::Sequential dp_network(std::uint64_t seed, int hidden = 32) {
  torch::manual_seed(seed);
  torch::nn::Linear first(kDpFeatures, hidden);
  torch::nn::BatchNorm1d norm(hidden);
  {
    torch::NoGradGuard no_grad;
    norm->weight.uniform_(0.5, 1.5);
    norm->bias.uniform_(-0.5, 0.5);
    norm->running_mean.uniform_(-0.5, 0.5);
    norm->running_var.uniform_(0.5, 1.5);
    norm->num_batches_tracked.fill_(static_cast<std::int64_t>(seed % 7));
  }
  return torch::nn::Sequential(first, norm, torch::nn::Tanh(), torch::nn::Linear(hidden, hidden),
                               torch::nn::ReLU(), torch::nn::Linear(hidden, hidden),
                               torch::nn::Tanh(), torch::nn::Linear(hidden, hidden),
                               TiedTranspose(first), torch::nn::Linear(kDpFeatures, 4));
}

/// The network's parameters, then its buffers: what the ranks must agree on.
inline std::vector<torch::Tensor> dp_state(const torch::nn::Module& net) {
  std::vector<torch::Tensor> out;
  for (const auto& p : net.parameters()) out.push_back(p.detach().clone());
  for (const auto& b : net.buffers()) out.push_back(b.detach().clone());
  return out;
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
