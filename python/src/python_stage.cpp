#include "python_stage.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <utility>

namespace py = pybind11;

namespace remat::python {
namespace {

std::string python_type_name(const py::handle& object) {
  return py::str(py::type::handle_of(object).attr("__name__"));
}

}  // namespace

py::object to_python(const torch::Tensor& tensor) {
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(tensor));
}

PythonStage::PythonStage(py::object function, bool takes_context)
    : function_(std::move(function)), takes_context_(takes_context) {
  const PythonScope python;
  if (!PyCallable_Check(function_.ptr()))
    throw StageError("a " + python_type_name(function_) + " is not callable");
  is_module_ = py::isinstance(function_, py::module_::import("torch.nn").attr("Module"));
  type_name_ = python_type_name(function_);
}

PythonStage::~PythonStage() {
  // The last reference may go in an autograd thread, without the GIL.
  if (Py_IsInitialized()) {
    const PythonScope python;
    function_ = py::object();
  } else {
    function_.release();  // the interpreter is gone: nothing to decrement
  }
}

Tensors PythonStage::forward(const Tensors& inputs, const Tensors& context) {
  const PythonScope python;
  const std::size_t count = inputs.size() + (takes_context_ ? context.size() : 0);
  py::tuple args(count);
  for (std::size_t k = 0; k < count; ++k)
    args[k] = to_python(k < inputs.size() ? inputs[k] : context[k - inputs.size()]);
  const py::object result = function_(*args);
  if (THPVariable_Check(result.ptr())) return {THPVariable_Unpack(result.ptr())};
  if (py::isinstance<py::tuple>(result) || py::isinstance<py::list>(result)) {
    Tensors out;
    std::size_t position = 0;
    for (const py::handle item : result) {
      if (!THPVariable_Check(item.ptr()))
        throw StageError("returned a " + python_type_name(result) + " whose item " +
                         std::to_string(position) + " is a " + python_type_name(item) +
                         ", not a tensor");
      out.push_back(THPVariable_Unpack(item.ptr()));
      ++position;
    }
    return out;
  }
  throw StageError("returned a " + python_type_name(result) +
                   ", not a tensor or a tuple or list of tensors");
}

bool PythonStage::interrupts(const std::exception_ptr& error) const {
  const PythonScope python;
  // The Python exception's type, held by `error` while it lives.
  py::handle type;
  try {
    std::rethrow_exception(error);
  } catch (const py::error_already_set& python_error) {  // a forward's, or the loss's
    type = python_error.type();
  } catch (const python_error& python_error) {  // torch's: a backward's, from autograd's engine
    type = python_error.type;
  } catch (...) {
  }
  if (!type) return false;
  // KeyboardInterrupt, SystemExit, GeneratorExit: BaseExceptions that are not Exceptions.
  // torch.OutOfMemoryError from 2.1; torch.cuda.OutOfMemoryError is that class too, and the
  // only one in 2.0.
  const py::object out_of_memory =
      py::module_::import("torch").attr("cuda").attr("OutOfMemoryError");
  return !PyErr_GivenExceptionMatches(type.ptr(), PyExc_Exception) ||
         PyErr_GivenExceptionMatches(type.ptr(), out_of_memory.ptr());
}

std::string PythonStage::undeclared_parameter_advice() const {
  if (is_module_)
    return "Register it on the stage's module: an nn.Parameter attribute, or a submodule that "
           "holds it (a tensor attribute with requires_grad is not a parameter); or detach it";
  return "A function or lambda stage has no parameters of its own: make the stage an "
         "nn.Module that holds the parameter (or the module that owns it), or detach it";
}

void PythonStage::add_note(const std::exception_ptr& error, const std::string& note) const {
  try {
    std::rethrow_exception(error);
  } catch (const py::error_already_set& python_error) {
    const PythonScope python;
    try {
      const py::object& value = python_error.value();
      if (py::hasattr(value, "add_note")) value.attr("add_note")(note);  // Python 3.11 on
    } catch (const py::error_already_set&) {
      // A note is a courtesy: the error itself goes on as it was.
    }
  } catch (...) {
  }
}

std::vector<torch::Tensor> PythonStage::tensors_of(const char* method) const {
  if (!is_module_) return {};
  const PythonScope python;
  std::vector<torch::Tensor> out;
  for (const py::handle t : function_.attr(method)()) out.push_back(THPVariable_Unpack(t.ptr()));
  return out;
}

std::vector<torch::Tensor> PythonStage::parameters() const { return tensors_of("parameters"); }
std::vector<torch::Tensor> PythonStage::buffers() const { return tensors_of("buffers"); }

namespace {

// The torch.nn BatchNorms in `module` (itself included) if every buffer of it is one of their
// statistics (and it has some); else an empty list. Only those that run _BatchNorm's own
// forward, which reads the two settings as freezing needs: SyncBatchNorm's refuses a missing
// batch count, and a subclass's forward may do anything (their stages' buffers are copied).
// Needs the GIL.
py::list norms_of(const py::object& module) {
  const py::object batch_norm = py::module_::import("torch.nn.modules.batchnorm").attr("_BatchNorm");
  const py::object batch_norm_forward = batch_norm.attr("forward");
  py::list norms;
  std::vector<const void*> statistics;
  for (const py::handle m : module.attr("modules")()) {
    if (!py::isinstance(m, batch_norm)) continue;
    const py::object forward = py::type::handle_of(m).attr("forward");
    if (!forward.is(batch_norm_forward)) continue;
    norms.append(m);
    for (const char* name : {"running_mean", "running_var", "num_batches_tracked"}) {
      const py::object t = m.attr(name);
      if (THPVariable_Check(t.ptr())) statistics.push_back(THPVariable_Unpack(t.ptr()).unsafeGetTensorImpl());
    }
  }
  bool any = false;
  for (const py::handle b : module.attr("buffers")()) {
    any = true;
    const void* impl = THPVariable_Unpack(b.ptr()).unsafeGetTensorImpl();
    if (std::find(statistics.begin(), statistics.end(), impl) == statistics.end()) return py::list();
  }
  return any ? norms : py::list();
}

// `list` held by C++ functions whose last copy may go in an autograd thread: released under
// the GIL. Needs the GIL.
std::shared_ptr<py::list> gil_owned(py::list list) {
  return std::shared_ptr<py::list>(new py::list(std::move(list)), [](py::list* owned) {
    if (Py_IsInitialized()) {
      const PythonScope python;
      delete owned;
    } else {
      owned->release();  // the interpreter is gone: nothing to decrement
      delete owned;
    }
  });
}

}  // namespace

StageModule::NormFreezer PythonStage::norm_freezer() {
  if (!is_module_) return nullptr;
  const PythonScope python;
  py::list found = norms_of(function_);
  if (found.empty()) return nullptr;
  return [norms = gil_owned(std::move(found))]() -> std::function<void()> {
    const PythonScope python_to_freeze;
    // (module, momentum, num_batches_tracked) of each.
    std::shared_ptr<py::list> saved = gil_owned(py::list());
    for (const py::handle m : *norms) {
      saved->append(py::make_tuple(m, m.attr("momentum"), m.attr("num_batches_tracked")));
      m.attr("momentum") = py::float_(0.0);
      m.attr("num_batches_tracked") = py::none();  // the batch is counted only if a tensor
    }
    return [saved]() {
      const PythonScope python_to_restore;
      for (const py::handle entry : *saved) {
        const py::tuple t = py::reinterpret_borrow<py::tuple>(entry);
        t[0].attr("momentum") = t[1];
        t[0].attr("num_batches_tracked") = t[2];
      }
      *saved = py::list();
    };
  };
}

std::vector<bool> PythonStage::training_modes() const {
  const PythonScope python;
  if (!is_module_) return {};
  std::vector<bool> modes;
  for (const py::handle m : function_.attr("modules")()) modes.push_back(m.attr("training").cast<bool>());
  return modes;
}

void PythonStage::set_training_modes(const std::vector<bool>& modes) {
  const PythonScope python;
  if (!is_module_) return;
  std::size_t k = 0;
  // modules() is in pre-order, as training_modes() listed them; each flag is set alone.
  for (const py::handle m : function_.attr("modules")()) {
    if (k >= modes.size()) break;
    m.attr("training") = py::bool_(modes[k++]);
  }
}

void PythonStage::train(bool on) {
  const PythonScope python;
  if (is_module_) function_.attr("train")(on);
}

}  // namespace remat::python
