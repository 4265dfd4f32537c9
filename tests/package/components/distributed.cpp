// remat::distributed alone: a job of one rank (its own rendezvous on loopback) trains through
// DataParallel, whose averaged gradients are then the plain ones. The installed headers need no
// Gloo headers.
#include <remat/distributed.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>

#include <iostream>

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(8, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
  const torch::Tensor x = torch::randn({4, 8});
  net->forward(x).square().sum().backward();
  std::vector<torch::Tensor> plain;
  for (auto& p : net->parameters()) plain.push_back(p.grad().clone()), p.mutable_grad().zero_();

  remat::distributed::Environment env;
  env.master_port = remat::distributed::free_local_port();
  auto group = remat::distributed::Group::create(env, torch::kCPU);
  remat::distributed::DataParallel dp(net.ptr(), group);
  dp.backward(net->forward(x).square().sum());
  bool equal = true;
  const auto params = net->parameters();
  for (std::size_t k = 0; k < params.size(); ++k) equal = equal && params[k].grad().equal(plain[k]);
  std::cout << "distributed: " << dp.bucket_bytes().size() << " bucket(s), gradients "
            << (equal ? "equal" : "differ") << "\n";
  return equal ? 0 : 1;
}
