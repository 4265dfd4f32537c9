// remat::models alone: a torchvision port by name, with torchvision's parameter names.
#include <remat/models.h>

#include <iostream>

int main() {
  const remat::models::ModelInfo& info = remat::models::find_model("resnet18");
  torch::nn::Sequential net = info.make(10);
  const auto out = net->forward(torch::randn({2, 3, 32, 32}));
  std::cout << "models: " << info.name << " -> " << out.sizes() << "\n";
  return out.size(1) == 10 &&
                 remat::models::torchvision_name(net, "layer1_0.conv1.weight") ==
                     "layer1.0.conv1.weight"
             ? 0
             : 1;
}
