// remat_profiler_bench: the profiler's own overhead on CPU.
//
// For residual chains (ResNet-like: a stem stage, BasicBlocks of two Conv3x3+BN with the
// skip connection, a classifier stage) and for the built-in convnet, it times one plain
// training step (forward, backward; median of 5 after a warm-up) and a whole profile with
// the default options (warm-up, median of 5 repetitions per quantity) and with --repeat 1,
// and prints a markdown table with the ratios.
//
// Usage: remat_profiler_bench [--quick]

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "remat/models.h"
#include "remat/profiler.h"

namespace nn = torch::nn;
using Clock = std::chrono::steady_clock;

namespace {

struct BasicBlockImpl : nn::Module {
  BasicBlockImpl(int in, int out, int stride) {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
    bn1 = register_module("bn1", nn::BatchNorm2d(out));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", nn::BatchNorm2d(out));
    if (stride != 1 || in != out)
      down = register_module("down", remat::Block(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                                                  nn::BatchNorm2d(out)));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor y = torch::relu(bn1(conv1(x)));
    y = bn2(conv2(y));
    return torch::relu(y + (down ? down(x) : x));
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  remat::Block down{nullptr};
};
TORCH_MODULE(BasicBlock);

nn::Sequential resnet_like(const std::vector<int>& layers, int width) {
  nn::Sequential net;
  net->push_back("stem", remat::Block(nn::Conv2d(nn::Conv2dOptions(3, width, 3).padding(1).bias(false)),
                                      nn::BatchNorm2d(width), nn::ReLU()));
  int in = width;
  for (std::size_t stage = 0; stage < layers.size(); ++stage) {
    const int out = width << stage;
    for (int b = 0; b < layers[stage]; ++b) {
      net->push_back("layer" + std::to_string(stage + 1) + "_" + std::to_string(b),
                     BasicBlock(in, out, b == 0 && stage > 0 ? 2 : 1));
      in = out;
    }
  }
  net->push_back("fc", remat::Block(nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions({1, 1})),
                                    nn::Flatten(), nn::Linear(in, 10)));
  return net;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double step_seconds(nn::Sequential& net, const torch::Tensor& sample) {
  auto step = [&] {
    torch::Tensor out = net->forward(sample.clone().requires_grad_(true));
    out.sum().backward();
  };
  step();
  std::vector<double> times;
  for (int r = 0; r < 5; ++r) {
    const auto start = Clock::now();
    step();
    times.push_back(seconds_since(start));
  }
  std::sort(times.begin(), times.end());
  return times[2];
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  struct Case {
    std::string name;
    nn::Sequential net;
    std::vector<std::int64_t> input;
  };
  std::vector<Case> cases;
  cases.push_back({"resnet-like [2,2,2,2] w16", resnet_like({2, 2, 2, 2}, 16), {8, 3, 64, 64}});
  cases.push_back({"convnet (built-in)", remat::models::find_model("convnet").make(10), {8, 3, 64, 64}});
  if (!quick) {
    cases.push_back({"resnet-like [3,4,6,3] w16", resnet_like({3, 4, 6, 3}, 16), {8, 3, 64, 64}});
    cases.push_back({"resnet-like [2,2,2,2] w32", resnet_like({2, 2, 2, 2}, 32), {16, 3, 96, 96}});
  }
  std::printf("Machine: %d LibTorch threads.\n\n", torch::get_num_threads());
  std::printf("| chain | stages | input | plain step s | profile s (repeat 5) | ratio | profile s (repeat 1) | ratio |\n");
  std::printf("|---|---:|---|---:|---:|---:|---:|---:|\n");
  for (Case& c : cases) {
    torch::manual_seed(0);
    const torch::Tensor sample = torch::randn(c.input);
    const double step = step_seconds(c.net, sample);
    auto start = Clock::now();
    remat::profile(c.net, sample);
    const double full = seconds_since(start);
    start = Clock::now();
    remat::profile(c.net, sample, remat::ProfileOptions().repeat(1));
    const double once = seconds_since(start);
    std::string shape;
    for (std::size_t i = 0; i < c.input.size(); ++i) {
      if (i > 0) shape += 'x';  // not "" or "x" + ...: GCC 12 bug 105651 in C++20
      shape += std::to_string(c.input[i]);
    }
    std::printf("| %s | %zu | %s | %.3f | %.2f | %.0fx | %.2f | %.0fx |\n", c.name.c_str(), c.net->size(),
                shape.c_str(), step, full, full / step, once, once / step);
    std::fflush(stdout);
  }
  return 0;
}
