// remat::core alone: a callable stage with declared parameters runs with plain autograd, and
// an error of remat's LibTorch code is a c10::ValueError.
#include <remat/core.h>

#include <iostream>

int main() {
  torch::Tensor w = torch::full({4, 4}, 0.5).requires_grad_(true);
  std::vector<remat::NamedStage> stages{
      {"matmul", remat::callable_stage(
                     [w](const remat::Tensors& x, const remat::Tensors&) {
                       return remat::Tensors{torch::matmul(x[0], w)};
                     },
                     {w})},
      {"relu", remat::callable_stage([](const remat::Tensors& x, const remat::Tensors&) {
         return remat::Tensors{torch::relu(x[0])};
       })}};
  const remat::Tensors out = remat::run_stages(stages, {torch::ones({2, 4})});
  out[0].sum().backward();
  bool typed = false;
  try {
    remat::callable_stage(nullptr);
  } catch (const c10::ValueError&) {
    typed = true;
  }
  std::cout << "core: output " << out[0].sum().item<double>() << ", dW " << w.grad().sum().item<double>()
            << "\n";
  return out[0].sum().item<double>() == 16 && w.grad().sum().item<double>() == 32 && typed ? 0 : 1;
}
