#pragma once
// What the model tests share: reading the reference files the Python side writes, comparing
// with a tolerance, listing a chain's tensors under the reference's names, and a schedule at
// half the store-all peak for the checkpointed-equals-plain tests.

#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "remat/models.h"
#include "remat/runtime.h"
#include "remat/solver.h"

namespace remat::test {

/// A file of tensors written by torch.save ({"input": ..., "output": ...}) by name.
inline std::map<std::string, torch::Tensor> read_tensors(const std::string& path) {
  std::map<std::string, torch::Tensor> out;
  for (auto& entry : models::read_state_dict(path)) out[entry.name] = entry.tensor;
  return out;
}

/// max |a - b| relative to the scale of `expected` (its largest magnitude).
inline double relative_error(const torch::Tensor& actual, const torch::Tensor& expected) {
  REQUIRE(actual.sizes() == expected.sizes());
  const double scale = expected.abs().max().item<double>();
  return (actual - expected).abs().max().item<double>() / std::max(scale, 1e-30);
}

/// The VGG called `name` (vgg11 ... vgg19_bn) with `options`: the registry builds each at its
/// classifier's full width, the tests most 64 wide (VGGOptions::classifier_width).
inline torch::nn::Sequential vgg_named(const std::string& name, const models::VGGOptions& options) {
  const bool bn = name.size() > 3 && name.substr(name.size() - 3) == "_bn";
  const int depth = std::stoi(name.substr(3));
  switch (depth) {
    case 11:
      return bn ? models::vgg11_bn(options) : models::vgg11(options);
    case 13:
      return bn ? models::vgg13_bn(options) : models::vgg13(options);
    case 16:
      return bn ? models::vgg16_bn(options) : models::vgg16(options);
    case 19:
      return bn ? models::vgg19_bn(options) : models::vgg19(options);
    default:
      FAIL("no VGG " << name);
  }
  return nullptr;
}

/// Every parameter and buffer of `net` under the reference's name (torchvision_name).
inline std::map<std::string, torch::Tensor> reference_state(const torch::nn::Sequential& net) {
  std::map<std::string, torch::Tensor> state;
  for (const auto& p : net->named_parameters()) state[models::torchvision_name(net, p.key())] = p.value();
  for (const auto& b : net->named_buffers()) state[models::torchvision_name(net, b.key())] = b.value();
  return state;
}

/// "768,3,16,16".
inline std::string shape_text(const torch::Tensor& t) {
  std::string shape;
  for (int64_t d : t.sizes()) {
    if (!shape.empty()) shape += ',';  // not "" or "," + ...: GCC 12 bug 105651 in C++20
    shape += std::to_string(d);
  }
  return shape;
}

/// reference_state's names with their shapes.
inline std::map<std::string, std::string> reference_shapes(const torch::nn::Sequential& net) {
  std::map<std::string, std::string> shapes;
  for (const auto& [name, tensor] : reference_state(net)) shapes[name] = shape_text(tensor);
  return shapes;
}

/// A listing the Python side writes, one tensor a line ("vit_b_16 conv_proj.weight 768,3,16,16"):
/// model -> name -> shape.
inline std::map<std::string, std::map<std::string, std::string>> read_shape_listing(
    const std::string& path) {
  std::ifstream file(path);
  REQUIRE(file);
  std::map<std::string, std::map<std::string, std::string>> listing;
  for (std::string line; std::getline(file, line);) {
    std::istringstream words(line);
    std::string model, name, shape;
    words >> model >> name >> shape;
    listing[model][name] = shape;
  }
  return listing;
}

/// Measures `net` on `sample` without timing it (every stage 1 ms forward, 2 ms backward: the
/// schedule depends on memory alone), gives `chk` the chain, and computes the optimal schedule
/// at half the store-all peak (or the least budget, if higher), plus the runtime's reserve on
/// the sample's device.
inline const Solution& schedule_at_half(Checkpointable& chk, torch::nn::Sequential& net,
                                        const torch::Tensor& sample) {
  Chain chain = profile(net, sample, ProfileOptions().measure_time(false)).chain;
  for (auto& stage : chain.stages) stage.fwd_ms = 1, stage.bwd_ms = 2, stage.fwd_nograd_ms = 1;
  chk->set_chain(chain);
  const int64_t half = std::max(store_all_peak(chain) / 2, min_feasible_budget(chain, SolveOptions(0)));
  return chk->compute_sequence(half + runtime_reserve_bytes(sample.device()));
}

}  // namespace remat::test
