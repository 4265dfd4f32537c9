#include "remat/runtime/checkpointable.h"

#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>

#include <ostream>
#include <stdexcept>

#include "executor.h"

namespace remat {
namespace {

using torch::autograd::variable_list;

// The backward of the whole schedule, as one node of the caller's graph: the chain's output
// has it as grad_fn, the input is its next edge. A node of our own (not a custom Function):
// it can drop the engine's handle on y_L before running the backward phase, so that y_L is
// freed once B_{L-1} has used it, as in plain training. The node owns the step's executor;
// a graph dropped without backward frees it with the node.
class ScheduleBackward : public torch::autograd::Node {
 public:
  ScheduleBackward(std::shared_ptr<detail::Executor> executor, bool input_requires_grad,
                   const torch::Tensor& output)
      : executor_(std::move(executor)), input_requires_grad_(input_requires_grad),
        output_sizes_(output.sizes().vec()), output_options_(output.options()) {}
  std::string name() const override { return "remat::ScheduleBackward"; }

  variable_list apply(variable_list&& grads) override {
    if (!executor_)
      throw std::runtime_error(
          "remat: the backward of this step's schedule already ran; a checkpointed forward can "
          "be backpropagated once (retain_graph is not supported)");
    torch::Tensor grad = std::move(grads[0]);
    grads.clear();
    if (!grad.defined()) grad = torch::zeros(output_sizes_, output_options_);
    std::shared_ptr<detail::Executor> executor = std::move(executor_);
    torch::Tensor y0 = executor->run_backward(std::move(grad));
    executor.reset();
    if (!input_requires_grad_) y0 = torch::Tensor();
    return {y0};
  }

 private:
  std::shared_ptr<detail::Executor> executor_;
  bool input_requires_grad_;
  std::vector<std::int64_t> output_sizes_;
  torch::TensorOptions output_options_;
};

}  // namespace

std::int64_t runtime_reserve_bytes(c10::Device device) {
  return kRuntimeReserveTensors * counted_bytes(device, 32);
}

CheckpointableImpl::CheckpointableImpl(torch::nn::Sequential net) : net_(std::move(net)) {
  if (!net_) throw std::invalid_argument("Checkpointable: the network is empty (a null Sequential)");
  register_module("net", net_);
  stages_ = stages_of(net_);
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
  chain_ = profile(stages_, sample, options).chain;
  measured_sizes_ = sample.sizes().vec();
  measured_device_ = sample.device();
  solution_.reset();
  return *chain_;
}

void CheckpointableImpl::set_chain(Chain chain) {
  chain.validate("set_chain");
  if (chain.length() != static_cast<int>(stages_.size()))
    throw std::invalid_argument("Checkpointable::set_chain: the chain has " +
                                std::to_string(chain.length()) + " stages but the network " +
                                std::to_string(stages_.size()));
  chain_ = std::move(chain);
  measured_sizes_.clear();
  measured_device_.reset();
  solution_.reset();
}

const Solution& CheckpointableImpl::compute_sequence(std::int64_t budget_bytes, Algorithm algorithm) {
  return compute_sequence(SolveOptions(budget_bytes).algorithm(algorithm));
}

const Solution& CheckpointableImpl::compute_sequence(const SolveOptions& options) {
  if (!chain_)
    throw std::invalid_argument(
        "Checkpointable::compute_sequence: no chain yet; call measure(sample) or set_chain()");
  // The runtime's own tensors (the scalar roots of its inner backward calls) and the caller's
  // loss value come out of the budget: the schedule is computed for what is left.
  const std::int64_t reserve = runtime_reserve_bytes(device());
  SolveOptions reserved = options;
  reserved.budget_bytes(std::max<std::int64_t>(0, options.budget_bytes() - reserve));
  Solution solution = solve(*chain_, reserved);
  if (!solution.ok())
    throw std::invalid_argument(
        "Checkpointable::compute_sequence: " + std::string(algorithm_name(options.algorithm())) +
        " cannot run in " + std::to_string(options.budget_bytes()) + " bytes; it needs at least " +
        std::to_string(solution.min_feasible_budget_bytes + reserve) + " bytes (" +
        std::to_string(reserve) + " of them for the runtime's bookkeeping on " + device().str() + ")");
  solution_ = std::move(solution);
  return *solution_;
}

c10::Device CheckpointableImpl::device() const {
  if (measured_device_) return *measured_device_;
  for (const auto& p : net_->parameters()) return p.device();
  return c10::Device(c10::kCPU);
}

const Chain& CheckpointableImpl::chain() const {
  if (!chain_) throw std::logic_error("Checkpointable: no chain yet; call measure(sample) or set_chain()");
  return *chain_;
}

const Solution& CheckpointableImpl::solution() const {
  if (!solution_) throw std::logic_error("Checkpointable: no sequence yet; call compute_sequence(budget)");
  return *solution_;
}

void CheckpointableImpl::check_input(const torch::Tensor& input) const {
  const auto shape = [](c10::IntArrayRef sizes) {
    std::string out;
    for (std::size_t i = 0; i < sizes.size(); ++i) out += (i ? "x" : "") + std::to_string(sizes[i]);
    return out;
  };
  // The chain says whether its input has a gradient (the sample measured had one or not); one
  // computed here and not counted could take the step over the budget.
  if (input.requires_grad() && chain_->gradient_bytes(0) == 0)
    throw std::invalid_argument(
        "Checkpointable::forward: the input requires grad but the chain was measured with an "
        "input that does not (its gradient, " +
        std::to_string(counted_bytes(input.device(), static_cast<std::int64_t>(input.nbytes()))) +
        " bytes, is not in the budget): measure() a sample that requires grad, or pass "
        "input.detach()");
  if (!measured_sizes_.empty()) {
    bool fits = input.dim() == static_cast<std::int64_t>(measured_sizes_.size());
    for (std::size_t d = 0; fits && d < measured_sizes_.size(); ++d)
      fits = input.size(static_cast<std::int64_t>(d)) <= measured_sizes_[d];
    if (!fits)
      throw std::invalid_argument("Checkpointable::forward: the input is " + shape(input.sizes()) +
                                  " but the schedule was computed for " + shape(measured_sizes_) +
                                  "; a larger input would not fit the budget: call measure() with "
                                  "it, then compute_sequence()");
  } else if (counted_bytes(input.device(), static_cast<std::int64_t>(input.nbytes())) >
             chain_->input_bytes()) {
    throw std::invalid_argument("Checkpointable::forward: the input (" + shape(input.sizes()) +
                                ", " + std::to_string(input.nbytes()) +
                                " bytes) is larger than the chain's (" +
                                std::to_string(chain_->input_bytes()) +
                                " bytes); a larger input would not fit the budget: measure() it");
  }
}

torch::Tensor CheckpointableImpl::forward(torch::Tensor input) {
  if (!is_training() || !torch::GradMode::is_enabled()) return net_->forward(input);
  if (!solution_)
    throw std::logic_error(
        "Checkpointable::forward in training mode needs a sequence: call compute_sequence(budget) "
        "first (or use eval mode / torch::NoGradGuard for inference)");
  check_input(input);
  auto executor = std::make_shared<detail::Executor>(stages_, solution_->sequence, input.device());
  torch::Tensor output;
  {
    torch::NoGradGuard no_grad;  // the forward phase records its own graphs where it needs them
    output = executor->run_forward(input);
  }
  std::shared_ptr<ScheduleBackward> node(
      new ScheduleBackward(std::move(executor), input.requires_grad(), output),
      torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::create_gradient_edge(output, std::move(node));
  return output;
}

void CheckpointableImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::Checkpointable(" << stages_.size() << " stages";
  if (solution_)
    stream << ", " << algorithm_name(solution_->algorithm) << " sequence of "
           << solution_->sequence.size() << " operations, budget " << solution_->budget_bytes
           << " bytes";
  stream << ")";
}

}  // namespace remat
