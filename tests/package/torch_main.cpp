// Profiles a torchvision port through the installed remat::remat, checks its torchvision
// names, and solves its chain.
#include <remat/remat.h>
#include <torch/torch.h>

#include <iostream>

int main() {
  torch::nn::Sequential net =
      remat::models::resnet18(remat::models::ResNetOptions().num_classes(10));
  if (remat::models::torchvision_name(net, "layer1_0.conv1.weight") != "layer1.0.conv1.weight")
    return 1;
  const remat::Profile p = remat::profile(net, torch::randn({2, 3, 32, 32}),
                                          remat::ProfileOptions().measure_time(false));
  const std::int64_t least = remat::min_feasible_budget(p.chain, remat::SolveOptions(0));
  const auto solution = remat::solve(p.chain, remat::SolveOptions(least));
  std::cout << p.chain.length() << " stages: " << remat::collapsed_string(solution.sequence) << "\n";
  return solution.ok() && p.chain.length() == 11 ? 0 : 1;
}
