// remat._C: the C++ solver, profiler, runtime and pictures for the Python package
// (python/remat/). The Python layer gives them rotor's API; everything that decides or
// executes is here, in the same code as the C++ library's.
#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <optional>
#include <tuple>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "python_stage.h"
#include "remat/base/check.h"
#include "remat/base/files.h"
#include "remat/base/text.h"
#include "remat/base/units.h"
#include "remat/config.h"
#include "remat/profiler/memory_tracker.h"
#include "remat/profiler/profiler.h"
#include "remat/report/plots.h"
#include "remat/runtime/allocator.h"
#include "remat/runtime/checkpointable.h"
#include "remat/solver/chain.h"
#include "remat/solver/partition.h"
#include "remat/solver/solver.h"
#include "remat/solver/tradeoff.h"

namespace py = pybind11;

namespace remat::python {
namespace {

// (name, callable, takes_context) triples from Python, as stages.
using StageSpec = std::tuple<std::string, py::object, bool>;

std::vector<NamedStage> to_stages(const std::vector<StageSpec>& specs) {
  std::vector<NamedStage> stages;
  for (const auto& [name, function, takes_context] : specs)
    stages.emplace_back(name, std::make_shared<PythonStage>(function, takes_context));
  return stages;
}

// A Python object kept by C++ code that may drop it without the GIL (the profiler's options
// go when profiling ends, with the GIL released).
std::shared_ptr<py::object> hold(py::object object) {
  return std::shared_ptr<py::object>(new py::object(std::move(object)), [](py::object* held) {
    const PythonScope python;
    delete held;
  });
}

ProfileOptions profile_options(int repeat, int warmup, bool measure_time, const std::string& name,
                               py::object loss, bool output_held, py::object progress,
                               const std::string& timing, double max_steps) {
  ProfileOptions options;
  options.repeat(repeat).warmup(warmup).measure_time(measure_time).name(name).max_steps(max_steps);
  options.timing(parse_timing(timing));
  options.output_held(output_held);
  if (!loss.is_none()) {
    // Called by the profiler on the caller's thread, which holds the GIL.
    auto holder = hold(std::move(loss));
    options.loss([holder](const Tensors& outputs) {
      const PythonScope python;
      py::list members;
      for (const torch::Tensor& t : outputs) members.append(to_python(t));
      const py::object value = (*holder)(members);
      if (!THPVariable_Check(value.ptr()))
        throw InputError("the loss function returned a " +
                         std::string(py::str(py::type::handle_of(value).attr("__name__"))) +
                         ", not a tensor");
      return THPVariable_Unpack(value.ptr());
    });
  }
  if (!progress.is_none()) {
    auto holder = hold(std::move(progress));
    options.progress([holder](int stage, int stages, const std::string& stage_name) {
      const PythonScope python;
      (*holder)(stage, stages, stage_name);
    });
  }
  return options;
}

SolveOptions solve_options(std::int64_t budget, const std::string& algorithm, std::int64_t slots,
                           int segments, int threads, bool exact_storages = true,
                           bool offload = false, std::int64_t host_memory = -1) {
  // solve() refuses the options the algorithm would ignore.
  return SolveOptions(budget)
      .algorithm(parse_algorithm(algorithm))
      .slots(slots)
      .segments(segments)
      .threads(threads)
      .exact_storages(exact_storages)
      .offload(offload)
      .host_memory_bytes(host_memory);
}

// A link as Python gives it: (d2h_gbps, h2d_gbps, latency_ms), or None.
std::optional<Link> link_of(const std::optional<std::tuple<double, double, double>>& link) {
  if (!link) return std::nullopt;
  return Link{std::get<0>(*link), std::get<1>(*link), std::get<2>(*link)};
}
std::optional<std::tuple<double, double, double>> link_tuple(const std::optional<Link>& link) {
  if (!link) return std::nullopt;
  return std::make_tuple(link->d2h_gbps, link->h2d_gbps, link->latency_ms);
}

// The Python stages of a Python-made Checkpointable (none while it is being constructed).
std::vector<PythonStage*> python_stages(PyObject* self) {
  std::vector<PythonStage*> out;
  // What py::detail::is_holder_constructed does, which the pybind11 of torch 2.0 (2.10) lacks.
  if (!reinterpret_cast<py::detail::instance*>(self)->get_value_and_holder().holder_constructed())
    return out;
  for (const NamedStage& stage : py::cast<CheckpointableImpl&>(py::handle(self)).stages())
    if (auto* python = dynamic_cast<PythonStage*>(stage.module.get())) out.push_back(python);
  return out;
}

/// A remat error thrown with std::throw_with_nested over a Python exception (a stage's own
/// code failed while measuring): that exception becomes the raised error's __cause__, as
/// `raise ... from` would make it, with its traceback into the stage.
void chain_python_cause(const std::exception& error) {
  const auto* nested = dynamic_cast<const std::nested_exception*>(&error);
  if (nested == nullptr || !nested->nested_ptr() || !PyErr_Occurred()) return;
  // The cause's exception and traceback, held by the nested exception while `error` lives.
  py::handle value, traceback;
  try {
    std::rethrow_exception(nested->nested_ptr());
  } catch (const py::error_already_set& cause) {
    value = cause.value();
    traceback = cause.trace();
  } catch (const python_error& cause) {  // torch's, from a backward run by the engine
    value = cause.value;
    traceback = cause.traceback;
  } catch (...) {
    return;
  }
  if (!value) return;
  py::error_already_set raised;  // takes the error just set, normalized
  if (traceback) PyException_SetTraceback(value.ptr(), traceback.ptr());
  PyException_SetCause(raised.value().ptr(), value.inc_ref().ptr());  // steals
  raised.restore();
}

}  // namespace
}  // namespace remat::python

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace remat;
  using namespace remat::python;
  m.doc() = "remat's C++ core: the solver, the profiler, the runtime and the pictures";

  // Errors as torch's own bindings raise them: c10::ValueError (remat's bad input) ->
  // ValueError, c10::OutOfMemoryError -> torch.OutOfMemoryError, other c10::Error ->
  // RuntimeError, all without the C++ backtrace; the solver's std::invalid_argument ->
  // ValueError.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      std::rethrow_exception(p);
    } catch (const c10::Error& error) {
      torch::translate_exception_to_python(p);
      chain_python_cause(error);
    } catch (const std::invalid_argument& error) {
      PyErr_SetString(PyExc_ValueError, error.what());
    } catch (python_error& error) {
      // torch's, from a Python backward that autograd's engine ran, passed on untouched (an
      // interruption, PythonStage::interrupts): its own exception, as torch raises it.
      error.restore();
    }
  });

  m.attr("WITH_CUDA") = py::bool_(REMAT_WITH_CUDA != 0);
  // The core's limits, which the package checks before any work (remat/_arguments.py).
  m.attr("MAX_STAGES") = remat::kMaxStages;
  m.attr("MAX_THREADS") = remat::kMaxThreads;
  m.attr("MAX_PROFILE_REPEAT") = remat::kMaxProfileRepeat;
  m.attr("MAX_TRADEOFF_POINTS") = remat::kMaxTradeoffPoints;
  m.def("parse_size", &parse_size, py::arg("text"));
  m.def(
      "parse_budget",
      [](const std::string& text, std::int64_t store_all_peak_bytes,
         std::optional<std::int64_t> least) {
        if (!least) return parse_budget(text, store_all_peak_bytes);
        return parse_budget(text, store_all_peak_bytes, [&] { return *least; });
      },
      py::arg("text"), py::arg("store_all_peak_bytes"), py::arg("least") = py::none());
  m.def("budget_needs_least", &budget_needs_least, py::arg("text"));
  m.def("check_budget_syntax", &check_budget_syntax, py::arg("text"));
  m.def("format_bytes", &format_bytes, py::arg("bytes"));
  m.def("format_bytes_exact", &format_bytes_exact, py::arg("bytes"));
  m.def("format_signed_percent", &format_signed_percent, py::arg("percent"), py::arg("decimals") = 1);
  m.def("algorithms", [] {
    std::vector<std::string> names;
    for (const Algorithm a : all_algorithms()) names.emplace_back(algorithm_name(a));
    return names;
  });
  m.def("runtime_reserve_bytes", [](const std::string& device) {
    return runtime_reserve_bytes(c10::Device(device));
  });
  m.def("counted_bytes", [](const std::string& device, std::int64_t nbytes) {
    return counted_bytes(c10::Device(device), nbytes);
  });

  m.def("write_text_file", [](const std::string& path, const std::string& text) {
    py::gil_scoped_release release;
    write_text_file(path, text);
  }, py::arg("path"), py::arg("text"));
  m.def("keep_freed_memory", &keep_freed_memory, py::arg("pad_bytes") = std::int64_t{256} << 20);

  m.def("peak_during", [](py::function step, const std::string& device) {
    // remat's tracker (installed on the CPU by the first call): the peak of the step's
    // allocations above what was live before it.
    MemoryTracker& tracker = MemoryTracker::for_device(c10::Device(device));
    synchronize(c10::Device(device));
    const PeakScope scope(tracker);
    step();
    synchronize(c10::Device(device));
    return scope.peak_above_start();
  }, py::arg("step"), py::arg("device") = "cpu");

  py::class_<Chain>(m, "Chain")
      .def_static("from_json", [](const std::string& text, const std::string& source) {
        return parse_chain(text, source);
      }, py::arg("text"), py::arg("source") = "chain")
      .def_static("load", &load_chain, py::arg("path"))
      .def("to_json", &chain_to_json)
      .def("save", [](const Chain& chain, const std::string& path) { save_chain(chain, path); },
           py::arg("path"))
      .def_readwrite("name", &Chain::name)
      .def_property_readonly("length", &Chain::length)
      .def_property_readonly("input_bytes", &Chain::input_bytes)
      .def_readonly("loss_tmp_bytes", &Chain::loss_tmp_bytes)
      .def_readonly("output_held", &Chain::output_held)
      .def_readonly("restart_ms", &Chain::restart_ms)
      .def_property_readonly("link", [](const Chain& c) { return link_tuple(c.link); })
      // A copy with another link (or none), checked as a chain file's would be.
      .def("with_link", [](const Chain& c, const std::optional<std::tuple<double, double, double>>& link) {
        Chain out = c;
        out.link = link_of(link);
        out.validate("link");
        return out;
      }, py::arg("link"))
      .def_property_readonly("stage_names", [](const Chain& c) {
        std::vector<std::string> names;
        for (const Stage& s : c.stages) names.push_back(s.name);
        return names;
      })
      .def_property_readonly("fwd_ms", [](const Chain& c) {
        std::vector<double> v;
        for (const Stage& s : c.stages) v.push_back(s.fwd_ms);
        return v;
      })
      .def_property_readonly("bwd_ms", [](const Chain& c) {
        std::vector<double> v;
        for (const Stage& s : c.stages) v.push_back(s.bwd_ms);
        return v;
      })
      .def_property_readonly("output_bytes", [](const Chain& c) {
        std::vector<std::int64_t> v;
        for (int i = 1; i <= c.length(); ++i) v.push_back(c.activation_bytes(i));
        return v;
      })
      .def("store_all_peak", [](const Chain& c) { return store_all_peak(c); })
      .def("store_all_ms", &Chain::store_all_ms)
      .def("profile_svg", [](const Chain& c) { return profile_svg(c); });

  py::class_<Solution>(m, "Solution")
      .def_property_readonly("ok", &Solution::ok)
      .def_property_readonly("status", [](const Solution& s) { return std::string(status_name(s.status)); })
      .def_property_readonly("algorithm",
                             [](const Solution& s) { return std::string(algorithm_name(s.algorithm)); })
      .def_readonly("budget_bytes", &Solution::budget_bytes)
      .def_readonly("peak_bytes", &Solution::peak_bytes)
      .def_readonly("makespan_ms", &Solution::makespan_ms)
      .def_readonly("store_all_makespan_ms", &Solution::store_all_makespan_ms)
      .def_readonly("min_feasible_budget_bytes", &Solution::min_feasible_budget_bytes)
      .def_readonly("solved_budget_bytes", &Solution::solved_budget_bytes)
      .def_readonly("merged_stages", &Solution::merged_stages)
      .def_readonly("exact_storages", &Solution::exact_storages)
      .def_readonly("solve_seconds", &Solution::solve_seconds)
      .def_readonly("parameter", &Solution::parameter)
      .def_readonly("warning", &Solution::warning)
      .def_property_readonly("offloads", [](const Solution& s) { return s.simulation.offloads; })
      .def_property_readonly("copy_wait_ms", [](const Solution& s) { return s.simulation.copy_wait_ms; })
      .def_property_readonly("host_peak_bytes",
                             [](const Solution& s) { return s.simulation.host_peak_bytes; })
      .def_property_readonly("sequence", [](const Solution& s) { return collapsed_string(s.sequence); })
      .def_property_readonly("operations", [](const Solution& s) { return op_strings(s.sequence); });

  m.def("solve", [](const Chain& chain, std::int64_t budget, const std::string& algorithm,
                    std::int64_t slots, int segments, int threads, bool exact_storages,
                    bool offload, std::int64_t host_memory) {
    py::gil_scoped_release release;  // pure C++: other Python threads may run
    return solve(chain, solve_options(budget, algorithm, slots, segments, threads, exact_storages,
                                      offload, host_memory));
  }, py::arg("chain"), py::arg("budget"), py::arg("algorithm") = "optimal", py::arg("slots") = 0,
        py::arg("segments") = 0, py::arg("threads") = 0, py::arg("exact_storages") = true,
        py::arg("offload") = false, py::arg("host_memory") = -1);
  m.def("min_feasible_budget", [](const Chain& chain, const std::string& algorithm,
                                  std::int64_t slots, int segments, bool exact_storages,
                                  bool offload, std::int64_t host_memory) {
    py::gil_scoped_release release;
    return min_feasible_budget(chain, solve_options(0, algorithm, slots, segments, 0,
                                                    exact_storages, offload, host_memory));
  }, py::arg("chain"), py::arg("algorithm") = "optimal", py::arg("slots") = 0, py::arg("segments") = 0,
        py::arg("exact_storages") = true, py::arg("offload") = false, py::arg("host_memory") = -1);
  m.def("measure_link", [](const std::string& device, std::int64_t bytes, int repeat) {
    Link link;
    {
      py::gil_scoped_release release;
      link = measure_link(c10::Device(device), bytes, repeat);
    }
    return link_tuple(link);
  }, py::arg("device"), py::arg("bytes") = std::int64_t{64} << 20, py::arg("repeat") = 5);
  m.def("check_link", [](const std::tuple<double, double, double>& link) {
    link_of(link)->validate("link");
  }, py::arg("link"));
  m.def("schedule_svg", [](const Chain& chain, const Solution& s) { return schedule_svg(chain, s); });

  py::class_<TradeoffPoint>(m, "TradeoffPoint")
      .def_readonly("budget_bytes", &TradeoffPoint::budget_bytes)
      .def_readonly("feasible", &TradeoffPoint::feasible)
      .def_readonly("makespan_ms", &TradeoffPoint::makespan_ms)
      .def_readonly("peak_bytes", &TradeoffPoint::peak_bytes)
      .def_readonly("parameter", &TradeoffPoint::parameter);
  py::class_<Tradeoff>(m, "Tradeoff")
      .def_readonly("store_all_peak_bytes", &Tradeoff::store_all_peak_bytes)
      .def_readonly("store_all_makespan_ms", &Tradeoff::store_all_makespan_ms)
      .def_readonly("min_feasible_budget_bytes", &Tradeoff::min_feasible_budget_bytes)
      .def_readonly("budgets", &Tradeoff::budgets)
      .def_readonly("optimal", &Tradeoff::optimal)
      .def_readonly("revolve", &Tradeoff::revolve)
      .def_readonly("periodic_best", &Tradeoff::periodic_best)
      .def_readonly("periodic", &Tradeoff::periodic)
      .def_readonly("unit_bytes", &Tradeoff::unit_bytes)
      .def_readonly("warning", &Tradeoff::warning);
  m.def("tradeoff", [](const Chain& chain, std::int64_t from_bytes, std::int64_t to_bytes,
                       int points, std::int64_t slots, int threads) {
    py::gil_scoped_release release;
    return tradeoff(chain, TradeoffOptions().from_bytes(from_bytes).to_bytes(to_bytes)
                               .points(points).slots(slots).threads(threads));
  }, py::arg("chain"), py::arg("from_bytes") = 0, py::arg("to_bytes") = 0, py::arg("points") = 25,
        py::arg("slots") = 0, py::arg("threads") = 0);
  m.def("tradeoff_svg", [](const Chain& chain, const Tradeoff& t) { return tradeoff_svg(chain, t); });

  // A forward graph (remat-graph/1 text, as remat._graph writes it) split into stages: one past
  // each stage's last node, and the number of legal boundaries.
  m.def("partition_graph", [](const std::string& graph_json, int max_stages, const std::string& source) {
    const Graph graph = parse_graph(graph_json, source);
    const GraphPartition split = partition_graph(graph, PartitionOptions(max_stages));
    return py::make_tuple(split.ends, split.legal_boundaries);
  }, py::arg("graph_json"), py::arg("max_stages"), py::arg("source") = "graph");

  m.def("profile", [](const std::vector<StageSpec>& stages, const Tensors& inputs,
                      const Tensors& context, int repeat, int warmup, bool measure_time,
                      const std::string& name, py::object loss, bool output_held,
                      py::object progress, const std::string& timing, double max_steps) {
    std::vector<NamedStage> named = to_stages(stages);
    const ProfileOptions options = profile_options(repeat, warmup, measure_time, name,
                                                   std::move(loss), output_held,
                                                   std::move(progress), timing, max_steps);
    py::gil_scoped_release release;
    return profile(named, inputs, context, options).chain;
  }, py::arg("stages"), py::arg("inputs"), py::arg("context"), py::arg("repeat") = 5,
        py::arg("warmup") = 1, py::arg("measure_time") = true, py::arg("name") = "",
        py::arg("loss") = py::none(), py::arg("output_held") = true,
        py::arg("progress") = py::none(), py::arg("timing") = "auto", py::arg("max_steps") = 0.0);

  // The runtime: a CheckpointableImpl over Python stages. The Python class owns the modules
  // (registered there, for parameters(), state_dict() and DDP); this one runs them.
  // The stages' callables are Python objects held in C++: the garbage collector is shown
  // them (tp_traverse) and may drop them (tp_clear), or a cycle through them (a stage that is
  // a bound method of a module holding this Checkpointable, a chain whose module holds
  // checkpoint_sequential's cache) would never be freed.
  py::class_<CheckpointableImpl, std::shared_ptr<CheckpointableImpl>>(
      m, "Checkpointable", py::custom_type_setup([](PyHeapTypeObject* heap_type) {
        PyTypeObject* type = &heap_type->ht_type;
        type->tp_flags |= Py_TPFLAGS_HAVE_GC;
        type->tp_traverse = [](PyObject* self, visitproc visit, void* arg) -> int {
          Py_VISIT(Py_TYPE(self));
          for (PythonStage* python : python_stages(self)) Py_VISIT(python->function().ptr());
          return 0;
        };
        type->tp_clear = [](PyObject* self) -> int {
          for (PythonStage* python : python_stages(self)) python->clear();
          return 0;
        };
      }))
      .def(py::init([](const std::vector<StageSpec>& stages) {
             return std::make_shared<CheckpointableImpl>(to_stages(stages));
           }),
           py::arg("stages"))
      .def(
          "measure",
          [](CheckpointableImpl& self, const Tensors& inputs, const Tensors& context, int repeat,
             int warmup, bool measure_time, const std::string& name, py::object loss,
             bool output_held, py::object progress, const std::string& timing, double max_steps) {
            const ProfileOptions options =
                profile_options(repeat, warmup, measure_time, name, std::move(loss),
                                output_held, std::move(progress), timing, max_steps);
            // The profiler runs autograd's engine, which must not be entered holding the GIL;
            // the stages take it back to call Python.
            py::gil_scoped_release release;
            return Chain(self.measure(inputs, context, options));
          },
          py::arg("inputs"), py::arg("context"), py::arg("repeat") = 5, py::arg("warmup") = 1,
          py::arg("measure_time") = true, py::arg("name") = "", py::arg("loss") = py::none(),
          py::arg("output_held") = true, py::arg("progress") = py::none(),
          py::arg("timing") = "auto", py::arg("max_steps") = 0.0)
      .def("set_chain", &CheckpointableImpl::set_chain, py::arg("chain"))
      .def(
          "compute_sequence",
          [](CheckpointableImpl& self, std::int64_t budget, const std::string& algorithm,
             std::int64_t slots, int segments, int threads, bool exact_storages, bool offload,
             std::int64_t host_memory) {
            py::gil_scoped_release release;
            return Solution(self.compute_sequence(solve_options(
                budget, algorithm, slots, segments, threads, exact_storages, offload, host_memory)));
          },
          py::arg("budget"), py::arg("algorithm") = "optimal", py::arg("slots") = 0,
          py::arg("segments") = 0, py::arg("threads") = 0, py::arg("exact_storages") = true,
          py::arg("offload") = false, py::arg("host_memory") = -1)
      .def(
          "set_link",
          [](CheckpointableImpl& self,
             const std::optional<std::tuple<double, double, double>>& link) {
            self.set_link(link_of(link));
          },
          py::arg("link"))
      .def_property_readonly("host_memory",
                             [](const CheckpointableImpl& self) {
                               const CheckpointableImpl::HostMemory h = self.host_memory();
                               py::dict d;
                               d["in_use_bytes"] = h.in_use_bytes;
                               d["peak_bytes"] = h.peak_bytes;
                               d["held_bytes"] = h.held_bytes;
                               d["blocks"] = h.blocks;
                               return d;
                             })
      .def("reset_host_peak", &CheckpointableImpl::reset_host_peak)
      .def("free_host_memory", &CheckpointableImpl::free_host_memory)
      .def(
          "forward",
          [](CheckpointableImpl& self, const Tensors& inputs, const Tensors& context) {
            py::gil_scoped_release release;
            return self.forward(inputs, context);
          },
          py::arg("inputs"), py::arg("context"))
      .def("train", [](CheckpointableImpl& self, bool on) { self.train(on); })
      .def("has_chain", &CheckpointableImpl::has_chain)
      .def("has_sequence", &CheckpointableImpl::has_sequence)
      // Copies: a later measure() or compute_sequence() replaces them.
      .def_property_readonly("chain", [](const CheckpointableImpl& self) { return self.chain(); })
      .def_property_readonly("solution",
                             [](const CheckpointableImpl& self) { return self.solution(); })
      .def("store_all_peak", &CheckpointableImpl::store_all_peak)
      .def("set_outside_bytes", &CheckpointableImpl::set_outside_bytes, py::arg("bytes"))
      .def("reserve_bytes", &CheckpointableImpl::reserve_bytes)
      .def(
          "min_budget",
          [](const CheckpointableImpl& self, const std::string& algorithm, std::int64_t slots,
             int segments, bool exact_storages, bool offload, std::int64_t host_memory) {
            return self.min_budget(solve_options(0, algorithm, slots, segments, 0, exact_storages,
                                                 offload, host_memory));
          },
          py::arg("algorithm") = "optimal", py::arg("slots") = 0, py::arg("segments") = 0,
          py::arg("exact_storages") = true, py::arg("offload") = false, py::arg("host_memory") = -1)
      .def_property_readonly("device",
                             [](const CheckpointableImpl& self) { return self.device().str(); })
      .def("trace_next_step", &CheckpointableImpl::trace_next_step, py::arg("memory") = false)
      .def_property_readonly("last_trace",
                             [](const CheckpointableImpl& self) {
                               py::list out;
                               for (const TracedOperation& op : self.last_trace()) {
                                 py::dict entry;
                                 entry["operations"] = op.label;
                                 entry["kind"] = traced_kind_name(op.kind);
                                 entry["first"] = op.first;
                                 entry["last"] = op.last;
                                 entry["start_ms"] = op.start_ms;
                                 entry["measured_ms"] = op.measured_ms;
                                 entry["predicted_ms"] = op.predicted_ms;
                                 const auto bytes = [](std::int64_t b) -> py::object {
                                   if (b < 0) return py::none();
                                   return py::int_(b);
                                 };
                                 entry["measured_peak_bytes"] = bytes(op.measured_peak_bytes);
                                 entry["measured_after_bytes"] = bytes(op.measured_after_bytes);
                                 entry["predicted_peak_bytes"] = op.predicted_peak_bytes;
                                 entry["predicted_after_bytes"] = op.predicted_after_bytes;
                                 out.append(entry);
                               }
                               return out;
                             })
      .def_property_readonly("trace_summary", [](const CheckpointableImpl& self) {
        const TraceSummary t = summarize_trace(self.last_trace());
        const auto part = [](const TraceSummary::Part& p) {
          py::dict d;
          d["operations"] = p.operations;
          d["predicted_ms"] = p.predicted_ms;
          d["measured_ms"] = p.measured_ms;
          return d;
        };
        py::dict d;
        d["forward"] = part(t.forward);
        d["loss"] = part(t.loss);
        d["recomputation"] = part(t.recompute);
        d["backward"] = part(t.backward);
        d["copy"] = part(t.copy);
        d["between_ms"] = t.between_ms;
        d["caller_ms"] = t.caller_ms;
        d["predicted_ms"] = t.predicted_ms;
        d["measured_ms"] = t.measured_ms;
        return d;
      });
}
