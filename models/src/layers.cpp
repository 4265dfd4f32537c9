#include "layers.h"

#include <torch/utils.h>

#include <cmath>

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

}  // namespace remat::models::detail
