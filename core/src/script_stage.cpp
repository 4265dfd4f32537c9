#include "remat/core/script_stage.h"

#include <torch/csrc/jit/runtime/graph_executor.h>

#include <utility>

namespace remat {
namespace {

class ScriptStage : public StageModule {
 public:
  ScriptStage(std::shared_ptr<torch::jit::Module> module, bool takes_context)
      : module_(std::move(module)), takes_context_(takes_context) {
    if (!module_) throw StageError("the TorchScript module is null");
    if (!module_->find_method("forward"))
      throw StageError("the TorchScript module has no forward method");
  }

  Tensors forward(const Tensors& inputs, const Tensors& context) override {
    std::vector<torch::jit::IValue> args(inputs.begin(), inputs.end());
    if (takes_context()) args.insert(args.end(), context.begin(), context.end());
    // TorchScript checks the arguments against forward's signature and names a mismatch. The
    // graph executor's optimizations are off: they would change, between the profiled runs and
    // later ones, which tensors autograd keeps (memory the schedule did not plan for) and how
    // a recomputation computes (gradients no longer bit-identical). Each operation then runs
    // as in eager mode, every time.
    torch::jit::IValue value;
    {
      torch::jit::GraphOptimizerEnabledGuard unoptimized(false);
      value = module_->forward(std::move(args));
    }
    Tensors out;
    if (value.isTensor()) {
      out.push_back(value.toTensor());
    } else if (value.isTuple()) {
      for (const auto& element : value.toTupleRef().elements()) {
        if (!element.isTensor())
          throw StageError("returned a tuple with a " + element.tagKind() +
                           " in it, not only tensors");
        out.push_back(element.toTensor());
      }
    } else if (value.isTensorList()) {
      for (const torch::Tensor& t : value.toTensorVector()) out.push_back(t);
    } else {
      throw StageError("returned a " + value.tagKind() +
                       ", not a tensor or a tuple or list of tensors");
    }
    return out;
  }
  bool takes_context() const override { return takes_context_; }
  std::vector<torch::Tensor> parameters() const override {
    std::vector<torch::Tensor> out;
    for (const torch::Tensor& p : module_->parameters()) out.push_back(p);
    return out;
  }
  std::vector<torch::Tensor> buffers() const override {
    std::vector<torch::Tensor> out;
    for (const torch::Tensor& b : module_->buffers()) out.push_back(b);
    return out;
  }
  std::vector<bool> training_modes() const override {
    std::vector<bool> modes;
    for (const auto& m : module_->modules()) modes.push_back(m.is_training());
    return modes;
  }
  void set_training_modes(const std::vector<bool>& modes) override {
    // train() recurses; modules() lists parents first, so each module ends with its own flag.
    std::size_t k = 0;
    for (auto m : module_->modules()) {
      if (k < modes.size()) m.train(modes[k]);
      ++k;
    }
  }
  void train(bool on) override { module_->train(on); }
  std::string type_name() const override {
    return "TorchScript " + module_->type()->name()->qualifiedName();
  }

 private:
  std::shared_ptr<torch::jit::Module> module_;
  bool takes_context_;
};

}  // namespace

std::shared_ptr<StageModule> script_stage(std::shared_ptr<torch::jit::Module> module,
                                          bool takes_context) {
  return std::make_shared<ScriptStage>(std::move(module), takes_context);
}

}  // namespace remat
