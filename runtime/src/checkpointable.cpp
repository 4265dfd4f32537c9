#include "remat/runtime/checkpointable.h"

#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>

#include <cctype>
#include <ostream>
#include <set>
#include <unordered_set>
#include <stdexcept>

#include "executor.h"
#include "remat/base/text.h"
#include "remat/core/autograd_node.h"
#include "remat/core/error.h"

namespace remat {
namespace {

using torch::autograd::variable_list;

// The dtype autocast gives `device`'s type on this thread now, if it is on.
std::optional<c10::ScalarType> autocast_dtype(const c10::Device& device) {
  const detail::AutocastState autocast = detail::AutocastState::capture();
  const auto type = device.is_cuda() ? at::kCUDA : at::kCPU;
  if (!autocast.on(type)) return std::nullopt;
  return autocast.type(type);
}

// The parameters whose gradients a backward asked for some tensors only can return
// (torch.autograd.grad, backward(inputs=...)): ScheduleBackward has an edge to each one's
// accumulator, so that the engine finds the path to it. In a whole backward the node passes
// nothing there (the stages' own backward calls accumulated into .grad), and the accumulator then
// runs with no gradient: harmless without hooks, but a hook would run a second time (DDP's
// reducer, post-accumulate hooks) or with None (a tensor hook). So a parameter with any hook
// gets no edge, and no gradient can be asked of it. LibTorch before 2.1: none.
// `parameters`: each stage's.
std::vector<torch::Tensor> parameters_with_edges(const std::vector<Tensors>& parameters) {
  std::vector<torch::Tensor> out;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const Tensors& stage : parameters)
    for (const torch::Tensor& p : stage) {
      if (!p.requires_grad() || !p.is_leaf() || !seen.insert(p.unsafeGetTensorImpl()).second)
        continue;
      // A shared_ptr, or from PyTorch 2.15 an intrusive_ptr.
      const auto accumulator = torch::autograd::impl::grad_accumulator(p);
      if (!accumulator || !accumulator->pre_hooks().empty() ||
          !accumulator->post_hooks().empty() || !accumulator->tensor_pre_hooks().empty() ||
          !accumulator->retains_grad_hooks().empty() || accumulator->tensor_post_acc_grad_hooks())
        continue;
      out.push_back(p);
    }
#else
  (void)parameters;
#endif
  return out;
}

// The backward of the whole schedule, as one node of the caller's graph: y_L's members (those
// with a gradient, in order) have it as grad_fn, the input is its next edge. A node of our own (not a custom Function):
// it can drop the engine's handle on y_L before running the backward phase, so that y_L is
// freed once B_{L-1} has used it, as in plain training. The node owns the step's executor;
// a graph dropped without backward frees it with the node. After the inputs' edges, one to each
// parameter of parameters_with_edges().
class ScheduleBackward : public torch::autograd::Node {
 public:
  // `graded[m]`: whether output member m is one of the node's inputs (requires grad), in order.
  ScheduleBackward(std::shared_ptr<detail::Executor> executor,
                   std::vector<bool> input_requires_grad, std::vector<bool> graded,
                   std::vector<torch::Tensor> parameters)
      : executor_(std::move(executor)),
        input_requires_grad_(std::move(input_requires_grad)),
        graded_(std::move(graded)),
        parameters_(std::move(parameters)) {}
  std::string name() const override { return "remat::ScheduleBackward"; }

  variable_list apply(variable_list&& grads) override {
    TORCH_CHECK(executor_,
                "remat: the backward of this step's schedule already ran; a checkpointed forward "
                "can be backpropagated once (retain_graph is not supported)");
    TORCH_CHECK(!torch::GradMode::is_enabled(),
                "remat: a backward that makes a graph of the gradients (create_graph) through a "
                "checkpointed chain is not supported: its recomputed backward is not "
                "differentiable again");
    // A backward asked for some tensors only: the gradients of the parameters asked for come
    // back through the node's edges, and nothing accumulates into .grad.
    const auto* exec_info = torch::autograd::get_current_graph_task_exec_info();
    const bool some_only = exec_info != nullptr && !exec_info->empty();
    const std::size_t inputs = input_requires_grad_.size();
    if (some_only) {
      Tensors wanted(parameters_.size());
      for (std::size_t j = 0; j < parameters_.size(); ++j)
        if (task_should_compute_output(inputs + j)) wanted[j] = parameters_[j];
      executor_->capture_gradients(std::move(wanted));
    }
    // y_L: one gradient per output member (undefined for members without one, or that the
    // loss does not reach).
    Tensors y_out(graded_.size());
    std::size_t next = 0;
    for (std::size_t m = 0; m < graded_.size(); ++m)
      if (graded_[m]) y_out[m] = std::move(grads[next++]);
    grads.clear();
    std::shared_ptr<detail::Executor> executor = std::move(executor_);
    Tensors out = executor->run_backward(std::move(y_out));
    for (std::size_t k = 0; k < out.size(); ++k)
      if (!input_requires_grad_[k]) out[k] = torch::Tensor();
    Tensors captured = some_only ? executor->captured_gradients() : Tensors(parameters_.size());
    executor.reset();
    parameters_.clear();
    for (torch::Tensor& g : captured) out.push_back(std::move(g));
    return out;
  }

 private:
  std::shared_ptr<detail::Executor> executor_;
  std::vector<bool> input_requires_grad_;
  std::vector<bool> graded_;
  std::vector<torch::Tensor> parameters_;
};

// A module name LibTorch accepts: no dots, not empty.
std::string registration_name(const std::string& name, std::size_t index) {
  std::string out;
  for (const char c : name) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out.front())))
    out = "stage" + std::to_string(index) + "_" + out;
  return out;
}

std::string shape_string(c10::IntArrayRef sizes) {
  std::string out;
  for (std::size_t i = 0; i < sizes.size(); ++i) out += (i ? "x" : "") + std::to_string(sizes[i]);
  return out.empty() ? "a scalar" : out;
}

// The solver, which builds without LibTorch, reports bad input as std::invalid_argument; a
// Checkpointable reports it as the rest of its LibTorch code does (c10::ValueError).
template <typename F>
auto solver_call(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::invalid_argument& error) {
    throw InputError(error.what());
  }
}

}  // namespace

std::int64_t runtime_reserve_bytes(c10::Device device) {
  return kRuntimeReserveTensors * counted_bytes(device, 32);
}

CheckpointableImpl::CheckpointableImpl(torch::nn::Sequential net) : net_(std::move(net)) {
  TORCH_CHECK_VALUE(net_, "Checkpointable: the network is empty (a null Sequential)");
  register_module("net", net_);
  stages_ = stages_of(net_);
}

CheckpointableImpl::CheckpointableImpl(std::vector<NamedStage> stages)
    : net_(nullptr), stages_(std::move(stages)) {
  TORCH_CHECK_VALUE(!stages_.empty(), "Checkpointable: no stages");
  std::set<std::string> names;
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    const NamedStage& stage = stages_[i];
    TORCH_CHECK_VALUE(stage.module, "Checkpointable: stage ", i, " (", stage.name,
                      ") has no module (null)");
    std::string name = registration_name(stage.name, i);
    if (!names.insert(name).second) name += "_" + std::to_string(i);
    names.insert(name);
    if (auto module = stage.module->nn_module()) {
      register_module(name, module);
      continue;
    }
    if (stage.module->owned_elsewhere()) continue;
    // Parameters and buffers shared with an earlier stage are registered once.
    std::size_t k = 0;
    for (const torch::Tensor& p : stage.module->parameters()) {
      bool seen = false;
      for (const auto& q : this->parameters()) seen = seen || q.is_same(p);
      if (!seen) register_parameter(name + "_" + std::to_string(k++), p, p.requires_grad());
    }
    k = 0;
    for (const torch::Tensor& b : stage.module->buffers()) {
      bool seen = false;
      for (const auto& q : this->buffers()) seen = seen || q.is_same(b);
      if (!seen) register_buffer(name + "_buffer" + std::to_string(k++), b);
    }
  }
}

CheckpointableImpl::CheckpointableImpl(torch::nn::Sequential net, const torch::Tensor& sample)
    : CheckpointableImpl(std::move(net)) {
  measure(sample);
}

CheckpointableImpl::CheckpointableImpl(torch::nn::Sequential net, const torch::Tensor& sample,
                                       std::int64_t budget_bytes)
    : CheckpointableImpl(std::move(net), sample) {
  compute_sequence(budget_bytes);
}

const Chain& CheckpointableImpl::measure(const torch::Tensor& sample, const ProfileOptions& options) {
  return measure(Tensors{sample}, Tensors{}, options);
}

const Chain& CheckpointableImpl::measure(const Tensors& inputs, const Tensors& context,
                                         const ProfileOptions& options) {
  chain_ = profile(stages_, inputs, context, options).chain;
  measured_inputs_.clear();
  measured_context_.clear();
  for (const torch::Tensor& t : inputs)
    measured_inputs_.push_back({t.sizes().vec(), t.scalar_type(), t.device()});
  for (const torch::Tensor& t : context)
    measured_context_.push_back({t.sizes().vec(), t.scalar_type(), t.device()});
  measured_device_ = inputs.front().device();
  measured_parameters_ = parameter_signatures();
  measured_autocast_ = autocast_dtype(inputs.front().device());
  solution_.reset();
  return *chain_;
}

std::vector<Tensors> CheckpointableImpl::stage_parameters() const {
  std::vector<Tensors> out;
  out.reserve(stages_.size());
  for (const NamedStage& stage : stages_) out.push_back(stage.module->parameters());
  return out;
}

std::vector<std::vector<CheckpointableImpl::ParameterSignature>>
CheckpointableImpl::parameter_signatures(const std::vector<Tensors>& parameters) const {
  std::vector<std::vector<ParameterSignature>> out;
  for (const Tensors& stage : parameters) {
    std::vector<ParameterSignature> signatures;
    for (const torch::Tensor& p : stage)
      signatures.push_back({{p.sizes().vec(), p.scalar_type(), p.device()}, p.requires_grad()});
    out.push_back(std::move(signatures));
  }
  return out;
}

void CheckpointableImpl::check_unchanged(const Tensors& inputs,
                                         const std::vector<Tensors>& parameters) const {
  if (!measured_parameters_.empty()) {
    const auto describe = [](const ParameterSignature& p) {
      return std::string(c10::toString(p.tensor.dtype)) + " " + shape_string(p.tensor.sizes) +
             " on " + p.tensor.device.str() + (p.trained ? ", trained" : ", frozen");
    };
    const std::vector<std::vector<ParameterSignature>> now = parameter_signatures(parameters);
    for (std::size_t i = 0; i < now.size(); ++i) {
      const std::vector<ParameterSignature>& a = now[i];
      const std::vector<ParameterSignature>& b = measured_parameters_[i];
      TORCH_CHECK_VALUE(a.size() == b.size(), "Checkpointable::forward: stage ", i, " (",
                        stages_[i].name, ") has ", a.size(), " parameters, but ", b.size(),
                        " when the chain was measured: measure() (or set_chain) again");
      for (std::size_t k = 0; k < a.size(); ++k)
        // The same, or frozen since (less to compute and keep than planned: fine-tuning
        // freezes layers as it goes).
        TORCH_CHECK_VALUE(
            a[k].tensor.sizes == b[k].tensor.sizes && a[k].tensor.dtype == b[k].tensor.dtype &&
                a[k].tensor.device == b[k].tensor.device && (!a[k].trained || b[k].trained),
            "Checkpointable::forward: stage ", i, " (", stages_[i].name, ")'s parameter ", k,
            " is ", describe(a[k]), ", but ", describe(b[k]),
            " when the chain was measured: its activations, gradients or memory "
            "would not be the schedule's; measure() (or set_chain) again");
    }
  }
  if (measured_autocast_) {
    const std::optional<c10::ScalarType> now = autocast_dtype(inputs.front().device());
    TORCH_CHECK_VALUE(now && c10::elementSize(*now) <= c10::elementSize(*measured_autocast_),
                      "Checkpointable::forward: the chain was measured under autocast (",
                      c10::toString(*measured_autocast_), ") but this step runs ",
                      now ? std::string("under autocast (") + c10::toString(*now) + ")"
                          : std::string("without autocast"),
                      ": its activations are larger than the schedule's; measure() again as the "
                      "steps run");
  }
}

void CheckpointableImpl::set_chain(Chain chain) {
  solver_call([&] { chain.validate("set_chain"); });
  TORCH_CHECK_VALUE(chain.length() == static_cast<int>(stages_.size()),
                    "Checkpointable::set_chain: the chain has ",
                    counted(chain.length(), "stage"), " but the network ",
                    stages_.size());
  // Same length is not enough: a chain measured for another network (another model, a
  // changed stage) would predict memory that this one does not use.
  for (std::size_t i = 0; i < stages_.size(); ++i)
    TORCH_CHECK_VALUE(chain.stages[i].name == stages_[i].name, "Checkpointable::set_chain: stage ",
                      i, " is named '", chain.stages[i].name, "' in the chain but '",
                      stages_[i].name, "' in the network: a chain measured for another network?");
  chain_ = std::move(chain);
  measured_inputs_.clear();
  measured_context_.clear();
  measured_device_.reset();
  measured_parameters_ = parameter_signatures();
  measured_autocast_.reset();
  solution_.reset();
}

const Solution& CheckpointableImpl::compute_sequence(std::int64_t budget_bytes, Algorithm algorithm) {
  return compute_sequence(SolveOptions(budget_bytes).algorithm(algorithm));
}

const Solution& CheckpointableImpl::compute_sequence(const SolveOptions& options) {
  const Chain& chain = this->chain();
  // The runtime's own tensors (the scalar roots of its inner backward calls), the caller's
  // loss value and the bytes outside the chain the caller named (reserve_bytes()) come out of
  // the budget: the schedule is computed for what is left, and the figures reported to the
  // caller include them again.
  TORCH_CHECK_VALUE(options.budget_bytes() >= 0,
                    "Checkpointable::compute_sequence: a negative budget (", options.budget_bytes(),
                    " bytes)");
  const std::int64_t reserve = reserve_bytes();
  SolveOptions reserved = options;
  reserved.budget_bytes(std::max<std::int64_t>(0, options.budget_bytes() - reserve));
  Solution solution = solver_call([&] { return solve(chain, reserved); });
  solution.budget_bytes = options.budget_bytes();
  if (solution.min_feasible_budget_bytes >= 0) solution.min_feasible_budget_bytes += reserve;
  if (solution.ok()) solution.peak_bytes += reserve;
  solution_ = std::move(solution);
  return *solution_;
}

void CheckpointableImpl::set_link(std::optional<Link> link) {
  TORCH_CHECK(chain_, "Checkpointable::set_link: no chain yet; call measure(sample) or set_chain()");
  Chain chain = *chain_;
  chain.link = link;
  solver_call([&] { chain.validate("set_link"); });
  chain_ = std::move(chain);
  solution_.reset();
}

CheckpointableImpl::HostMemory CheckpointableImpl::host_memory() const {
  HostMemory out;
  if (!host_pool_) return out;
  const detail::HostPool::Stats stats = host_pool_->stats();
  out.in_use_bytes = stats.in_use_bytes;
  out.peak_bytes = stats.peak_bytes;
  out.held_bytes = stats.held_bytes;
  out.blocks = stats.blocks;
  return out;
}

void CheckpointableImpl::reset_host_peak() {
  if (host_pool_) host_pool_->reset_peak();
}

void CheckpointableImpl::free_host_memory() {
  if (host_pool_) host_pool_->free_idle();
}

void CheckpointableImpl::set_outside_bytes(std::int64_t bytes) {
  TORCH_CHECK_VALUE(bytes >= 0 && bytes <= kMaxChainBytes,
                    "Checkpointable::set_outside_bytes: ", bytes,
                    " bytes (from 0 to 2^50, the largest size a chain holds)");
  outside_bytes_ = bytes;
  solution_.reset();  // solved for other bytes
}

std::int64_t CheckpointableImpl::reserve_bytes() const {
  return runtime_reserve_bytes(device()) + outside_bytes_;
}

std::int64_t CheckpointableImpl::store_all_peak() const {
  return remat::store_all_peak(chain()) + reserve_bytes();
}

std::int64_t CheckpointableImpl::min_budget(const SolveOptions& options) const {
  const std::int64_t least = solver_call([&] { return min_feasible_budget(chain(), options); });
  return least >= 0 ? least + reserve_bytes() : -1;
}

c10::Device CheckpointableImpl::device() const {
  if (measured_device_) return *measured_device_;
  for (const NamedStage& stage : stages_)
    for (const auto& p : stage.module->parameters()) return p.device();
  return c10::Device(c10::kCPU);
}

const Chain& CheckpointableImpl::chain() const {
  TORCH_CHECK(chain_, "Checkpointable: no chain yet; call measure(sample) or set_chain()");
  return *chain_;
}

const Solution& CheckpointableImpl::solution() const {
  TORCH_CHECK(solution_, "Checkpointable: no sequence yet; call compute_sequence(budget)");
  return *solution_;
}

void CheckpointableImpl::check_inputs(const Tensors& inputs, const Tensors& context) const {
  const std::vector<Member>& members = chain_->inputs;
  TORCH_CHECK_VALUE(inputs.size() == members.size(),
                    "Checkpointable::forward: ", counted(static_cast<std::int64_t>(inputs.size()), "input tensor"),
                    ", but the chain's input has ", counted(static_cast<std::int64_t>(members.size()), "member"));
  const bool measured = !measured_inputs_.empty();
  TORCH_CHECK_VALUE(!measured || context.size() == measured_context_.size(),
                    "Checkpointable::forward: ", counted(static_cast<std::int64_t>(context.size()), "context tensor"),
                    ", but measure() was given ", measured_context_.size());
  for (const auto* list : {&inputs, &context}) {
    for (std::size_t k = 0; k < list->size(); ++k) {
      const torch::Tensor& t = (*list)[k];
      const std::string what = list == &inputs
                                   ? (inputs.size() == 1 ? std::string("the input")
                                                         : "input member " + std::to_string(k))
                                   : "context tensor " + std::to_string(k);
      TORCH_CHECK_VALUE(t.defined(), "Checkpointable::forward: ", what, " is an undefined tensor");
      // The chain says whether each member has a gradient (the sample measured had one or
      // not); one computed here and not counted could take the step over the budget.
      TORCH_CHECK_VALUE(
          list != &inputs || !t.requires_grad() || members[k].grad,
          "Checkpointable::forward: ", what,
          " requires grad but the chain was measured with an input that does not (its gradient, ",
          counted_bytes(t.device(), static_cast<std::int64_t>(t.nbytes())),
          " bytes, is not in the budget): measure() a sample that requires grad, or pass it "
          "detached");
      TORCH_CHECK_VALUE(list != &context || !t.requires_grad(), "Checkpointable::forward: ", what,
                        " requires grad; context tensors have no gradient");
      if (measured) {
        const Signature& sig = (list == &inputs ? measured_inputs_ : measured_context_)[k];
        TORCH_CHECK_VALUE(t.scalar_type() == sig.dtype && t.device() == sig.device,
                          "Checkpointable::forward: ", what, " is ", c10::toString(t.scalar_type()),
                          " on ", t.device().str(), " but the chain was measured with ",
                          c10::toString(sig.dtype), " on ", sig.device.str(),
                          ": its bytes would not be the schedule's; measure() again");
        TORCH_CHECK_VALUE(t.dim() == static_cast<std::int64_t>(sig.sizes.size()),
                          "Checkpointable::forward: ", what, " is ", shape_string(t.sizes()), " (",
                          t.dim(), " dimensions) but the chain was measured with ",
                          shape_string(sig.sizes), " (", sig.sizes.size(),
                          " dimensions): measure() an input of this shape");
        bool fits = true;
        for (std::size_t d = 0; fits && d < sig.sizes.size(); ++d)
          fits = t.size(static_cast<std::int64_t>(d)) <= sig.sizes[d];
        TORCH_CHECK_VALUE(fits, "Checkpointable::forward: ", what, " is ", shape_string(t.sizes()),
                          " but the schedule was computed for ", shape_string(sig.sizes),
                          "; a larger input would not fit the budget: call measure() with it, then "
                          "compute_sequence()");
      } else if (list == &inputs) {
        TORCH_CHECK_VALUE(
            counted_bytes(t.device(), static_cast<std::int64_t>(t.nbytes())) <= members[k].bytes,
            "Checkpointable::forward: ", what, " (", shape_string(t.sizes()), ", ", t.nbytes(),
            " bytes) is larger than the chain's (", members[k].bytes,
            " bytes); a larger input would not fit the budget: measure() it");
      }
    }
  }
}

torch::Tensor CheckpointableImpl::forward(torch::Tensor input) {
  Tensors out = forward(Tensors{std::move(input)}, Tensors{});
  TORCH_CHECK_VALUE(out.size() == 1, "Checkpointable::forward: the chain's output has ", out.size(),
                    " members; call forward(inputs, context) to get them all");
  return out.front();
}

Tensors CheckpointableImpl::forward(const Tensors& inputs, const Tensors& context) {
  if (!is_training() || !torch::GradMode::is_enabled()) return run_stages(stages_, inputs, context);
  TORCH_CHECK(
      solution_,
      "Checkpointable::forward in training mode needs a sequence: call compute_sequence(budget) "
      "first (or use eval mode / torch::NoGradGuard for inference)");
  TORCH_CHECK(solution_->ok(), "Checkpointable::forward: the last compute_sequence(",
              solution_->budget_bytes,
              " bytes) found no schedule: ", algorithm_name(solution_->algorithm),
              " needs at least ", solution_->min_feasible_budget_bytes,
              " bytes; call compute_sequence with a budget that works");
  check_inputs(inputs, context);
  // Each stage's parameters, once for the step: checked, watched for in-place changes, and the
  // backward node's edges.
  const std::vector<Tensors> parameters = stage_parameters();
  check_unchanged(inputs, parameters);
  if (!host_pool_ && solution_->simulation.offloads > 0)
    host_pool_ = std::make_shared<detail::HostPool>();
  auto executor = std::make_shared<detail::Executor>(stages_, *chain_, solution_->sequence,
                                                     inputs.front().device(), host_pool_);
  if (trace_next_) {
    trace_next_ = false;
    executor->record_with(
        std::make_shared<detail::StepRecorder>(inputs.front().device(), solution_->sequence,
                                               solution_->simulation, last_trace_, trace_memory_));
  }
  Tensors outputs;
  {
    torch::NoGradGuard no_grad;  // the forward phase records its own graphs where it needs them
    outputs = executor->run_forward(inputs, context, parameters);
  }
  std::vector<bool> input_requires_grad, graded;
  for (const torch::Tensor& t : inputs) input_requires_grad.push_back(t.requires_grad());
  const std::vector<Member>& out_members = chain_->members(chain_->length());
  for (std::size_t m = 0; m < outputs.size(); ++m) graded.push_back(out_members[m].grad);
  std::vector<torch::Tensor> with_edges = parameters_with_edges(parameters);
  torch::autograd::edge_list edges = torch::autograd::collect_next_edges(inputs);
  for (const torch::Tensor& p : with_edges)
    edges.push_back(torch::autograd::impl::gradient_edge(p));
  auto node = detail::make_node<ScheduleBackward>(
      std::move(executor), std::move(input_requires_grad), graded, std::move(with_edges));
  node->set_next_edges(std::move(edges));
  std::uint32_t nr = 0;
  for (std::size_t m = 0; m < outputs.size(); ++m) {
    if (!graded[m]) continue;
    nr = node->add_input_metadata(outputs[m]);
    torch::autograd::impl::set_gradient_edge(outputs[m], torch::autograd::Edge(node, nr));
  }
  return outputs;
}

void CheckpointableImpl::trace_next_step(bool memory) {
  trace_next_ = true;
  trace_memory_ = memory;
}

const char* traced_kind_name(TracedOperation::Kind kind) {
  switch (kind) {
    case TracedOperation::Kind::kForward: return "forward";
    case TracedOperation::Kind::kLoss: return "loss";
    case TracedOperation::Kind::kRecomputation: return "recomputation";
    case TracedOperation::Kind::kBackward: return "backward";
    case TracedOperation::Kind::kCopy: return "copy";
  }
  return "";
}

std::vector<TracedOperation::Kind> operation_kinds(const Sequence& sequence) {
  using Kind = TracedOperation::Kind;
  std::vector<Kind> kinds;
  bool after_loss = false;
  for (const Op& op : sequence) {
    kinds.push_back(op.is_copy()                   ? Kind::kCopy
                    : op.kind == OpKind::kLoss     ? Kind::kLoss
                    : op.kind == OpKind::kBackward ? Kind::kBackward
                    : after_loss                   ? Kind::kRecomputation
                                                   : Kind::kForward);
    after_loss = after_loss || op.kind == OpKind::kLoss;
  }
  return kinds;
}

TraceSummary summarize_trace(const std::vector<TracedOperation>& trace) {
  TraceSummary summary;
  for (std::size_t k = 0; k < trace.size(); ++k) {
    const TracedOperation& op = trace[k];
    using Kind = TracedOperation::Kind;
    TraceSummary::Part& part = op.kind == Kind::kLoss            ? summary.loss
                               : op.kind == Kind::kBackward      ? summary.backward
                               : op.kind == Kind::kRecomputation ? summary.recompute
                               : op.kind == Kind::kCopy          ? summary.copy
                                                                 : summary.forward;
    part.operations += static_cast<int>(op.last - op.first + 1);
    part.predicted_ms += op.predicted_ms;
    part.measured_ms += op.measured_ms;
    summary.predicted_ms += op.predicted_ms;
    if (k + 1 < trace.size()) {
      const double gap = trace[k + 1].start_ms - (op.start_ms + op.measured_ms);
      // The loss operation ends the forward phase; the caller's loss and backward follow.
      (op.kind == Kind::kLoss ? summary.caller_ms : summary.between_ms) += gap;
    }
  }
  if (!trace.empty())
    summary.measured_ms = trace.back().start_ms + trace.back().measured_ms - summary.caller_ms;
  return summary;
}

void CheckpointableImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::Checkpointable(" << counted(static_cast<std::int64_t>(stages_.size()), "stage");
  if (solution_)
    stream << ", " << algorithm_name(solution_->algorithm) << " sequence of "
           << solution_->sequence.size() << " operations, budget " << solution_->budget_bytes
           << " bytes";
  stream << ")";
}

}  // namespace remat
