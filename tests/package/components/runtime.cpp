// remat::runtime alone: a Checkpointable trains a chain at its least budget with the gradients
// of plain autograd.
#include <remat/runtime.h>

#include <iostream>

int main() {
  torch::manual_seed(0);
  std::vector<torch::Tensor> weights;
  std::vector<remat::NamedStage> stages;
  for (int i = 0; i < 6; ++i) {
    torch::Tensor w = (torch::randn({32, 32}) / 6).requires_grad_(true);
    weights.push_back(w);
    stages.push_back({"layer" + std::to_string(i),
                      remat::callable_stage(
                          [w](const remat::Tensors& x, const remat::Tensors&) {
                            return remat::Tensors{torch::tanh(torch::matmul(x[0], w))};
                          },
                          {w})});
  }
  const torch::Tensor x = torch::randn({16, 32});
  remat::run_stages(stages, {x})[0].square().sum().backward();
  std::vector<torch::Tensor> plain;
  for (auto& w : weights) plain.push_back(w.grad().clone()), w.mutable_grad().zero_();

  remat::Checkpointable chk(stages);
  chk->measure(x, remat::ProfileOptions().measure_time(false));
  const remat::Solution& s = chk->compute_sequence(chk->min_budget());
  if (!s.ok()) return 1;
  chk->forward(x).square().sum().backward();
  bool equal = true;
  for (std::size_t k = 0; k < weights.size(); ++k) equal = equal && weights[k].grad().equal(plain[k]);
  std::cout << "runtime: " << remat::collapsed_string(s.sequence) << ", gradients "
            << (equal ? "equal" : "differ") << "\n";
  return equal ? 0 : 1;
}
