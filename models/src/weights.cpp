#include "remat/models/weights.h"

#include <torch/utils.h>

#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "layers.h"

namespace remat::models {

std::string torchvision_name(const torch::nn::Sequential& model, const std::string& key) {
  if (const auto* chain = dynamic_cast<const detail::TorchvisionChainImpl*>(model.get()))
    return chain->torchvision_name(key);
  return key;
}

namespace {

/// torchvision's DenseNet loader renames "denselayer1.norm.1.weight" to
/// "denselayer1.norm1.weight" (names from before PyTorch 0.4); so do we.
std::string modern_densenet_name(const std::string& name) {
  static const std::regex old_name(
      R"(^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:[12])\.(?:weight|bias|running_mean|running_var))$)");
  std::smatch match;
  if (std::regex_match(name, match, old_name)) return match[1].str() + match[2].str();
  return name;
}

/// torchvision's ViT loader renames the MLP's "mlp.linear_1" and "mlp.linear_2" (the names of
/// the published ViT weights) to "mlp.0" and "mlp.3"; so do we.
std::string modern_vit_name(const std::string& name) {
  static const std::regex old_name(
      R"(^(encoder\.layers\.encoder_layer_\d+\.mlp\.)linear_([12])(\..*)$)");
  std::smatch match;
  if (std::regex_match(name, match, old_name))
    return match[1].str() + (match[2].str() == "1" ? "0" : "3") + match[3].str();
  return name;
}

std::string list(const std::vector<std::string>& names) {
  constexpr std::size_t kShown = 12;
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < kShown; ++i)
    out += (i ? ", " : "") + names[i];
  if (names.size() > kShown) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

std::string shape(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

}  // namespace

void load_torchvision_weights(torch::nn::Sequential& model,
                              const std::vector<StateDictEntry>& state_dict,
                              const std::string& source) {
  // Drop a "module." prefix common to every name (a model saved from nn.DataParallel).
  bool data_parallel = !state_dict.empty();
  for (const auto& entry : state_dict)
    data_parallel = data_parallel && entry.name.compare(0, 7, "module.") == 0;
  // The file's names as torchvision's current loaders see them, in file order.
  std::vector<std::string> names;
  std::map<std::string, const torch::Tensor*> values;
  for (const auto& entry : state_dict) {
    names.push_back(
        modern_vit_name(modern_densenet_name(data_parallel ? entry.name.substr(7) : entry.name)));
    values[names.back()] = &entry.tensor;
  }

  std::vector<std::pair<torch::Tensor, const torch::Tensor*>> copies;
  std::vector<torch::Tensor> zeroed;  // num_batches_tracked absent from the file
  std::vector<std::string> missing, misshaped;
  std::set<std::string> used;
  const auto visit = [&](const std::string& key, const torch::Tensor& target) {
    const std::string name = torchvision_name(model, key);
    const auto found = values.find(name);
    if (found == values.end()) {
      const std::string suffix = "num_batches_tracked";
      if (name.size() >= suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
        zeroed.push_back(target);
      else
        missing.push_back(name);
      return;
    }
    used.insert(name);
    if (found->second->sizes() != target.sizes())
      misshaped.push_back(name + " (file " + shape(*found->second) + ", model " + shape(target) +
                          ")");
    else
      copies.emplace_back(target, found->second);
  };
  for (const auto& item : model->named_parameters()) visit(item.key(), item.value());
  for (const auto& item : model->named_buffers()) visit(item.key(), item.value());
  std::vector<std::string> unexpected;
  for (const std::string& name : names)
    if (!used.count(name)) unexpected.push_back(name);

  if (!missing.empty() || !unexpected.empty() || !misshaped.empty()) {
    std::string message = source + " does not fit the model:";
    if (!missing.empty()) message += "\n  missing (" + std::to_string(missing.size()) + "): " + list(missing);
    if (!unexpected.empty())
      message += "\n  unexpected (" + std::to_string(unexpected.size()) + "): " + list(unexpected);
    if (!misshaped.empty())
      message += "\n  wrong shape (" + std::to_string(misshaped.size()) + "): " + list(misshaped);
    throw WeightsError(message);
  }
  torch::NoGradGuard no_grad;
  for (auto& [target, value] : copies) target.copy_(*value);
  for (auto& target : zeroed) target.zero_();
}

void load_torchvision_weights(torch::nn::Sequential& model, const std::string& path) {
  load_torchvision_weights(model, read_state_dict(path), path);
}

}  // namespace remat::models
