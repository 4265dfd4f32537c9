#include "remat/core/stage.h"

#include <c10/util/Type.h>
#include <torch/nn/modules/batchnorm.h>

#include <cctype>
#include <tuple>
#include <type_traits>
#include <unordered_set>
#include <utility>

namespace remat {
namespace {

// AnyModule::any_forward takes its arguments as a pack; a stage's count is known at run time.
template <std::size_t... I>
torch::nn::AnyValue call_with(torch::nn::AnyModule& module, const Tensors& args,
                              std::index_sequence<I...>) {
  return module.any_forward(args[I]...);
}

torch::nn::AnyValue call_any(torch::nn::AnyModule& module, const Tensors& args) {
  switch (args.size()) {
    case 1:
      return call_with(module, args, std::make_index_sequence<1>());
    case 2:
      return call_with(module, args, std::make_index_sequence<2>());
    case 3:
      return call_with(module, args, std::make_index_sequence<3>());
    case 4:
      return call_with(module, args, std::make_index_sequence<4>());
    case 5:
      return call_with(module, args, std::make_index_sequence<5>());
    case 6:
      return call_with(module, args, std::make_index_sequence<6>());
    case 7:
      return call_with(module, args, std::make_index_sequence<7>());
    case 8:
      return call_with(module, args, std::make_index_sequence<8>());
    default:
      throw StageError("a C++ module stage is called with " + std::to_string(args.size()) +
                       " tensors (input members and context); it takes 1 to 8");
  }
}

class AnyModuleStage : public StageModule {
 public:
  AnyModuleStage(torch::nn::AnyModule module, bool takes_context)
      : module_(std::move(module)), takes_context_(takes_context) {
    if (module_.is_empty()) throw StageError("the module is empty (a default AnyModule)");
    takes_list_ = dynamic_cast<const MemberListModule*>(module_.ptr().get()) != nullptr;
  }

  Tensors forward(const Tensors& inputs, const Tensors& context) override {
    Tensors args = inputs;
    if (takes_context_) args.insert(args.end(), context.begin(), context.end());
    torch::nn::AnyValue value =
        takes_list_ ? module_.any_forward(std::move(args)) : call_any(module_, args);
    if (auto* one = value.try_get<torch::Tensor>()) return {std::move(*one)};
    if (auto* list = value.try_get<Tensors>()) return std::move(*list);
    if (auto* pair = value.try_get<std::tuple<torch::Tensor, torch::Tensor>>())
      return {std::get<0>(*pair), std::get<1>(*pair)};
    if (auto* triple = value.try_get<std::tuple<torch::Tensor, torch::Tensor, torch::Tensor>>())
      return {std::get<0>(*triple), std::get<1>(*triple), std::get<2>(*triple)};
    throw StageError("returned " + c10::demangle(value.type_info().name()) +
                     ", not a tensor, a std::vector<torch::Tensor> or a tuple of tensors");
  }
  bool takes_context() const override { return takes_context_; }
  std::vector<torch::Tensor> parameters() const override { return module_.ptr()->parameters(); }
  std::vector<torch::Tensor> buffers() const override { return module_.ptr()->buffers(); }
  std::vector<bool> training_modes() const override {
    std::vector<bool> modes;
    for (const auto& m : module_.ptr()->modules(/*include_self=*/true))
      modes.push_back(m->is_training());
    return modes;
  }
  void set_training_modes(const std::vector<bool>& modes) override {
    const auto modules = module_.ptr()->modules(/*include_self=*/true);
    // train() recurses into children; modules() is in pre-order (parents first), so each ends
    // with its own flag.
    for (std::size_t k = 0; k < modules.size() && k < modes.size(); ++k)
      modules[k]->train(modes[k]);
  }
  void train(bool on) override { module_.ptr()->train(on); }
  std::shared_ptr<torch::nn::Module> nn_module() const override { return module_.ptr(); }
  std::string type_name() const override { return short_type_name(module_.ptr()->name()); }

 private:
  // any_forward is not const, although it does not change the holder: ours is a copy.
  mutable torch::nn::AnyModule module_;
  bool takes_context_;
  bool takes_list_;  // a MemberListModule
};

}  // namespace

namespace {

// A LibTorch BatchNorm's settings that freezing changes: its momentum and its batch count.
struct NormSettings {
  using Momentum = std::decay_t<decltype(std::declval<torch::nn::BatchNormOptions&>().momentum())>;
  Momentum* momentum;
  torch::Tensor* batches;
};

// The BatchNorm of type Impl that `module` is, if it is one: its settings, and its statistics
// into `statistics`.
template <typename Impl>
bool add_norm(torch::nn::Module& module, std::vector<NormSettings>& norms,
              std::unordered_set<const void*>& statistics) {
  auto* norm = dynamic_cast<Impl*>(&module);
  if (norm == nullptr) return false;
  norms.push_back({&norm->options.momentum(), &norm->num_batches_tracked});
  for (const torch::Tensor* t : {&norm->running_mean, &norm->running_var, &norm->num_batches_tracked})
    if (t->defined()) statistics.insert(t->unsafeGetTensorImpl());
  return true;
}

// The BatchNorms of a C++ stage if every buffer of it is one of their statistics (and it has
// some); else none.
std::vector<NormSettings> norms_of(const StageModule& stage) {
  const std::shared_ptr<torch::nn::Module> module = stage.nn_module();
  if (!module) return {};
  std::vector<NormSettings> norms;
  std::unordered_set<const void*> statistics;
  for (const std::shared_ptr<torch::nn::Module>& m : module->modules(/*include_self=*/true))
    add_norm<torch::nn::BatchNorm1dImpl>(*m, norms, statistics) ||
        add_norm<torch::nn::BatchNorm2dImpl>(*m, norms, statistics) ||
        add_norm<torch::nn::BatchNorm3dImpl>(*m, norms, statistics);
  const std::vector<torch::Tensor> buffers = stage.buffers();
  if (buffers.empty()) return {};
  for (const torch::Tensor& b : buffers)
    if (statistics.count(b.unsafeGetTensorImpl()) == 0) return {};
  return norms;
}

}  // namespace

std::string StageModule::undeclared_parameter_advice() const {
  return "Register it as a parameter of the stage's module (register_parameter), list it among "
         "a callable stage's parameters (callable_stage(f, {tensor})), or detach it";
}

StageModule::NormFreezer StageModule::norm_freezer() {
  std::vector<NormSettings> norms = norms_of(*this);
  if (norms.empty()) return nullptr;
  return [norms = std::move(norms)]() -> std::function<void()> {
    std::vector<NormSettings::Momentum> momenta;
    std::vector<torch::Tensor> batches;
    for (const NormSettings& norm : norms) {
      momenta.push_back(*norm.momentum);
      batches.push_back(*norm.batches);
      *norm.momentum = 0.0;
      *norm.batches = torch::Tensor();  // BatchNorm's forward counts the batch only if defined
    }
    return [norms, momenta = std::move(momenta), batches = std::move(batches)]() mutable {
      for (std::size_t k = 0; k < norms.size(); ++k) {
        *norms[k].momentum = momenta[k];
        *norms[k].batches = std::move(batches[k]);
      }
    };
  };
}

std::shared_ptr<StageModule> module_stage(torch::nn::AnyModule module, bool takes_context) {
  return std::make_shared<AnyModuleStage>(std::move(module), takes_context);
}

CallableStage::CallableStage(StageFunction function, std::vector<torch::Tensor> parameters,
                             std::vector<torch::Tensor> buffers, bool takes_context)
    : function_(std::move(function)),
      parameters_(std::move(parameters)),
      buffers_(std::move(buffers)),
      takes_context_(takes_context) {
  if (!function_) throw StageError("the callable is empty");
  for (const auto* list : {&parameters_, &buffers_})
    for (const torch::Tensor& t : *list)
      if (!t.defined()) throw StageError("a declared parameter or buffer is an undefined tensor");
}

Tensors CallableStage::forward(const Tensors& inputs, const Tensors& context) {
  static const Tensors kNone;
  return function_(inputs, takes_context_ ? context : kNone);
}

void CallableStage::set_training_modes(const std::vector<bool>& modes) {
  if (!modes.empty()) training_ = modes.front();
}

std::shared_ptr<CallableStage> callable_stage(StageFunction function,
                                              std::vector<torch::Tensor> parameters,
                                              std::vector<torch::Tensor> buffers,
                                              bool takes_context) {
  return std::make_shared<CallableStage>(std::move(function), std::move(parameters),
                                         std::move(buffers), takes_context);
}

Tensors run_stages(const std::vector<NamedStage>& stages, const Tensors& inputs,
                   const Tensors& context) {
  Tensors x = inputs;
  for (const NamedStage& stage : stages) x = stage.module->forward(x, context);
  return x;
}

std::string short_type_name(const std::string& name) {
  // Drops every namespace qualifier ("torch::nn::", "(anonymous namespace)::") and the "Impl"
  // that ends a class name, template arguments included.
  static const std::string kAnonymous = "(anonymous namespace)";
  std::string out;
  std::size_t start = 0;  // where the current name starts in `out`
  const auto end_name = [&] {
    if (out.size() - start > 4 && out.compare(out.size() - 4, 4, "Impl") == 0)
      out.resize(out.size() - 4);
  };
  for (std::size_t i = 0; i < name.size();) {
    if (name.compare(i, kAnonymous.size(), kAnonymous) == 0) {
      out += kAnonymous;
      i += kAnonymous.size();
    } else if (name.compare(i, 2, "::") == 0) {
      out.resize(start);  // the qualifier read so far
      i += 2;
    } else if (std::isalnum(static_cast<unsigned char>(name[i])) || name[i] == '_') {
      out += name[i++];
    } else {
      end_name();
      out += name[i++];
      start = out.size();
    }
  }
  end_name();
  return out;
}

std::vector<NamedStage> stages_of(const torch::nn::Sequential& sequential) {
  std::vector<NamedStage> out;
  const auto children = sequential->named_children();
  int index = 0;
  for (const auto& module : *sequential) {
    // A child's own name ("conv1") when it has one, else its index and type ("3:Conv2d").
    const std::string& key = children[static_cast<std::size_t>(index)].key();
    const bool numbered = key.find_first_not_of("0123456789") == std::string::npos;
    out.emplace_back(
        numbered ? std::to_string(index) + ":" + short_type_name(module.ptr()->name()) : key,
        module);
    ++index;
  }
  return out;
}

}  // namespace remat
