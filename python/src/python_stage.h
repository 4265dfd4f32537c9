#pragma once
// A Python callable as a stage of remat's C++ profiler and runtime: a torch.nn.Module (its
// parameters, buffers and training flags are the module's) or any callable of tensors. Called
// with the input members and then, when it takes the context, the context tensors, each as one
// positional argument; returns a tensor, or a tuple or list of tensors.
//
// The C++ code calls it from any thread: from the caller's (measure, forward) and from the
// autograd engine's (recomputations during backward, which Python starts with the GIL
// released). Every call into Python takes the GIL here, in a PythonScope.

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "remat/core/stage.h"

namespace remat::python {

/// What C++ holds to call into Python, from any thread: the GIL, with any Python error pending
/// on this thread set aside while the scope lasts and put back as it was at its end. torch's
/// autograd engine leaves one there: PythonEngine::execute restores a Python backward's error
/// into the thread before rethrowing it (for THPEngine_run_backward to return), also when C++
/// called the engine, as the profiler and the runtime do. Python run while an error is pending
/// misbehaves, far from the cause: torch.nn modules made afterwards lacked their parameters
/// ("'Linear' object has no attribute 'weight'") in the next tests.
class PythonScope {
 public:
  PythonScope() = default;
  PythonScope(const PythonScope&) = delete;
  PythonScope& operator=(const PythonScope&) = delete;

 private:
  pybind11::gil_scoped_acquire gil_;  // first: the pending error is the GIL holder's
  pybind11::error_scope pending_;
};

/// A new Python reference to `tensor` (a torch.Tensor sharing it); needs the GIL.
pybind11::object to_python(const torch::Tensor& tensor);

class PythonStage : public StageModule {
 public:
  PythonStage(pybind11::object function, bool takes_context);
  ~PythonStage() override;
  Tensors forward(const Tensors& inputs, const Tensors& context) override;
  bool takes_context() const override { return takes_context_; }
  std::vector<torch::Tensor> parameters() const override;
  std::vector<torch::Tensor> buffers() const override;
  std::vector<bool> training_modes() const override;
  void set_training_modes(const std::vector<bool>& modes) override;
  void train(bool on) override;
  std::string type_name() const override { return type_name_; }
  bool owned_elsewhere() const override { return true; }
  bool interrupts(const std::exception_ptr& error) const override;
  void add_note(const std::exception_ptr& error, const std::string& note) const override;
  std::string undeclared_parameter_advice() const override;
  /// torch.nn's BatchNorm1d/2d/3d (those that run _BatchNorm.forward; not SyncBatchNorm, whose
  /// forward refuses a missing batch count): momentum 0 and num_batches_tracked None while
  /// frozen.
  NormFreezer norm_freezer() override;
  /// The Python callable (for the garbage collector's traversal; needs the GIL).
  pybind11::handle function() const { return function_; }
  /// Drops the callable (the garbage collector breaking a cycle; needs the GIL).
  void clear() { function_ = pybind11::none(); }

 private:
  // Tensors from one of the module's iterator methods ("parameters", "buffers"); none for a
  // callable that is not a module.
  std::vector<torch::Tensor> tensors_of(const char* method) const;

  pybind11::object function_;
  bool is_module_;
  bool takes_context_;
  std::string type_name_;
};

}  // namespace remat::python
