#pragma once
// remat's stages: what the profiler measures and the runtime executes, whatever they are made
// of. A stage has a name, parameters and buffers, a training mode, and maps the members of its
// input activation x_i (a list of tensors) and the step's context tensors to the members of
// its output activation x_{i+1}:
//
//   std::vector<remat::NamedStage> stages = remat::stages_of(sequential);  // its children
//   stages.push_back({"head", remat::callable_stage(
//       [&](const remat::Tensors& x, const remat::Tensors&) { return remat::Tensors{fc(x[0])}; },
//       fc->parameters())});
//   stages.push_back({"block", remat::script_stage(  // remat/core/script_stage.h
//       std::make_shared<torch::jit::Module>(torch::jit::load("block.pt")))});
//
// Members may be of any dtype (integer token ids, boolean masks): those that do not require
// grad have no gradient. An output member that *is* one of the input tensors, returned as it
// came (not a view or a copy), is carried: the same storage, its gradient passed back
// unchanged; that is how a skip connection travels over several stages. The context (an
// attention mask, position ids) is given once per step and seen by every stage that takes it;
// it has no gradient.
//
// The profiler and the runtime use nothing else of a stage, so that every kind of stage (C++
// modules, callables, TorchScript here; Python modules in the Python package) is measured and
// executed by the same code.

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "remat/core/error.h"

namespace remat {

/// The members of an activation, or the context tensors.
using Tensors = std::vector<torch::Tensor>;

/// What a stage computes. Implementations must keep forward() free of side effects other than
/// on their own buffers (BatchNorm's running statistics) and the random generators: the runtime
/// may run it again and restores both.
class StageModule {
 public:
  virtual ~StageModule() = default;
  /// x_{i+1} from x_i and the context (the context only if takes_context()).
  virtual Tensors forward(const Tensors& inputs, const Tensors& context) = 0;
  /// Whether forward() is given the context tensors.
  virtual bool takes_context() const = 0;
  /// Every parameter and buffer, once each.
  virtual std::vector<torch::Tensor> parameters() const = 0;
  virtual std::vector<torch::Tensor> buffers() const = 0;
  /// The training flag of each module inside (the stage's own first), and setting them back
  /// from such a list; train() sets them all.
  virtual std::vector<bool> training_modes() const = 0;
  virtual void set_training_modes(const std::vector<bool>& modes) = 0;
  virtual void train(bool on) = 0;
  /// The module the stage is, for registration in a parent module (C++ modules); null for
  /// the others, whose parameters and buffers are registered one by one.
  virtual std::shared_ptr<torch::nn::Module> nn_module() const { return nullptr; }
  /// "Conv2d", "callable", "TorchScript <qualified class name>".
  virtual std::string type_name() const = 0;
  /// Whether the parameters and buffers are registered by an owner of their own (a Python
  /// module, registered in the Python class), so that a parent must not hold them: they may
  /// be replaced there (load_state_dict(assign=True)).
  virtual bool owned_elsewhere() const { return false; }
  /// Whether an exception thrown by forward() or during its backward is not the stage's
  /// failure but an interruption to pass on untouched (Python's KeyboardInterrupt and
  /// SystemExit, and out of memory): the profiler then does not report it as the stage's.
  virtual bool interrupts(const std::exception_ptr& /*error*/) const { return false; }
  /// Adds `note` to an exception that forward() threw, of a kind the runtime cannot amend
  /// without changing its type, so that the caller learns which stage failed (a Python
  /// exception: its add_note). The runtime adds a c10::Error's context itself.
  virtual void add_note(const std::exception_ptr& /*error*/, const std::string& /*note*/) const {}
  /// What the user can do, in the stage's language, about a tensor that requires grad which
  /// the stage's forward uses but which is no stage's parameter (the profiler refuses it).
  virtual std::string undeclared_parameter_advice() const;
  /// Called before a forward that must leave the stage's running statistics as they are (a
  /// recomputation: the step's first forward updated them): sets each BatchNorm of the stage
  /// so that its forward leaves them exactly as they are (momentum 0 and the batch not counted:
  /// each average becomes 1 * itself + 0 * the batch's), and returns what sets them back. The
  /// output does not read them (training mode: the batch's statistics), or nothing changes
  /// them (eval mode). Lives no longer than the stage.
  using NormFreezer = std::function<std::function<void()>()>;
  /// The stage's NormFreezer, found once (the runtime asks once a step), where every buffer of
  /// the stage is a running statistic of a BatchNorm (running mean, running variance, batch
  /// count) and it has some; null otherwise. With one, the runtime freezes the BatchNorms for
  /// a recomputation instead of copying the buffers aside and back, which on a GPU costs
  /// several transfers per BatchNorm. C++ stages: LibTorch's BatchNorm1d/2d/3d in
  /// nn_module(); Python stages: torch.nn's BatchNorm1d/2d/3d (not SyncBatchNorm).
  virtual NormFreezer norm_freezer();
};

/// A C++ module as a stage. Its forward() is called with the input members and then, when
/// `takes_context`, the context tensors, each as one torch::Tensor argument (at most 8 in all),
/// or all of them as one std::vector<torch::Tensor> if the module derives from
/// MemberListModule; it returns one tensor, a std::vector<torch::Tensor>, or a std::tuple of
/// two or three tensors.
std::shared_ptr<StageModule> module_stage(torch::nn::AnyModule module, bool takes_context = false);

/// Marks a C++ module whose forward() takes its input members (then the context, if the stage
/// takes it) as one std::vector<torch::Tensor>, rather than one argument per tensor. That is
/// what lets a torch::nn::Sequential, which passes one value from child to child, chain modules
/// whose activations are tuples: a child returning a std::vector<torch::Tensor> feeds one that
/// takes it.
///
///   struct CarryImpl : torch::nn::Module, remat::MemberListModule {
///     std::vector<torch::Tensor> forward(std::vector<torch::Tensor> x) { ... }
///   };
class MemberListModule {
 public:
  virtual ~MemberListModule() = default;
};

/// The signature of a callable stage.
using StageFunction = std::function<Tensors(const Tensors& inputs, const Tensors& context)>;

/// A C++ callable as a stage, with the parameters and buffers it uses (the runtime snapshots
/// the buffers to update them once per step; the optimizer needs the parameters). It has a
/// training flag of its own, which it can read through the returned object's is_training().
class CallableStage : public StageModule {
 public:
  CallableStage(StageFunction function, std::vector<torch::Tensor> parameters,
                std::vector<torch::Tensor> buffers, bool takes_context);
  Tensors forward(const Tensors& inputs, const Tensors& context) override;
  bool takes_context() const override { return takes_context_; }
  std::vector<torch::Tensor> parameters() const override { return parameters_; }
  std::vector<torch::Tensor> buffers() const override { return buffers_; }
  std::vector<bool> training_modes() const override { return {training_}; }
  void set_training_modes(const std::vector<bool>& modes) override;
  void train(bool on) override { training_ = on; }
  bool is_training() const { return training_; }
  std::string type_name() const override { return "callable"; }

 private:
  StageFunction function_;
  std::vector<torch::Tensor> parameters_, buffers_;
  bool takes_context_;
  bool training_ = true;
};

std::shared_ptr<CallableStage> callable_stage(StageFunction function,
                                              std::vector<torch::Tensor> parameters = {},
                                              std::vector<torch::Tensor> buffers = {},
                                              bool takes_context = false);

/// One stage of a chain: a name for reports and error messages, and what it computes.
struct NamedStage {
  NamedStage() = default;
  NamedStage(std::string stage_name, std::shared_ptr<StageModule> stage_module)
      : name(std::move(stage_name)), module(std::move(stage_module)) {}
  /// A C++ module that takes no context.
  NamedStage(std::string stage_name, torch::nn::AnyModule stage_module)
      : name(std::move(stage_name)), module(module_stage(std::move(stage_module))) {}

  std::string name;
  std::shared_ptr<StageModule> module;
};

/// Runs `stages` one after the other with plain autograd (no checkpointing): the reference a
/// Checkpointable's gradients equal, and what it runs in eval mode. Returns the members of the
/// last stage's output.
Tensors run_stages(const std::vector<NamedStage>& stages, const Tensors& inputs,
                   const Tensors& context = {});

/// The stages of a Sequential, named as its children ("conv1"), or by index and type when they
/// are numbered ("3:Conv2d"); none takes the context.
std::vector<NamedStage> stages_of(const torch::nn::Sequential& sequential);

/// "torch::nn::Conv2dImpl" -> "Conv2d", "(anonymous namespace)::PairImpl" -> "Pair",
/// "ns::WrapImpl<ns::BlockImpl>" -> "Wrap<Block>".
std::string short_type_name(const std::string& name);

/// Thrown by a stage's forward for a result that is not a list of tensors; the profiler and
/// the runtime name the stage. Bad input: a c10::ValueError (error.h).
class StageError : public InputError {
 public:
  using InputError::InputError;
};

}  // namespace remat
