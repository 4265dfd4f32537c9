#include "layers.h"

#include <torch/utils.h>
#include <torch/version.h>

#include <cmath>
#include <limits>

namespace remat::models::detail {

std::string TorchvisionChainImpl::torchvision_name(const std::string& key) const {
  const std::pair<std::string, std::string>* best = nullptr;
  for (const auto& rule : renames_)
    if (key.compare(0, rule.first.size(), rule.first) == 0 &&
        (best == nullptr || rule.first.size() > best->first.size()))
      best = &rule;
  return best ? best->second + key.substr(best->first.size()) : key;
}

void trunc_normal_(torch::Tensor weight, double mean, double std, double a, double b) {
  torch::NoGradGuard no_grad;
  const auto normal_cdf = [](double x) { return (1.0 + std::erf(x / std::sqrt(2.0))) / 2.0; };
  const double low = normal_cdf((a - mean) / std), high = normal_cdf((b - mean) / std);
  weight.uniform_(2 * low - 1, 2 * high - 1);
  weight.erfinv_();
  weight.mul_(std * std::sqrt(2.0)).add_(mean);
  weight.clamp_(a, b);
}

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        bool causal, double dropout) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout, causal);
#else
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(q.size(-1)));
  if (causal) {
    const int64_t n = q.size(-2), m = k.size(-2);
    scores = scores.masked_fill(torch::ones({n, m}, q.options().dtype(torch::kBool)).triu(1),
                                -std::numeric_limits<double>::infinity());
  }
  torch::Tensor weights = torch::softmax(scores, -1);
  if (dropout > 0) weights = torch::dropout(weights, dropout, /*train=*/true);
  return torch::matmul(weights, v);
#endif
}

}  // namespace remat::models::detail
