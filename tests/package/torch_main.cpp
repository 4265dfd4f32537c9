// Profiles a built-in model through the installed remat::remat and solves its chain.
#include <remat/remat.h>
#include <torch/torch.h>

#include <iostream>

int main() {
  torch::nn::Sequential net = remat::models::convnet(remat::models::ConvNetOptions().blocks(2));
  const remat::Profile p = remat::profile(net, torch::randn({2, 3, 16, 16}),
                                          remat::ProfileOptions().measure_time(false));
  const std::int64_t least = remat::min_feasible_budget(p.chain, remat::SolveOptions(0));
  const auto solution = remat::solve(p.chain, remat::SolveOptions(least));
  std::cout << p.chain.length() << " stages: " << remat::collapsed_string(solution.sequence) << "\n";
  return solution.ok() ? 0 : 1;
}
