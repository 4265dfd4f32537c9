#include "remat/runtime/checkpointable.h"

#include <torch/autograd.h>

#include <ostream>
#include <stdexcept>

#include "executor.h"

namespace remat {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The executor of one step travels in the autograd context inside a one-byte tensor whose
// deleter releases it: dropped with the graph when backward never runs.
torch::Tensor hold(std::shared_ptr<detail::Executor> executor) {
  auto* box = new std::shared_ptr<detail::Executor>(std::move(executor));
  return torch::from_blob(
      box, {1}, [](void* p) { delete static_cast<std::shared_ptr<detail::Executor>*>(p); },
      torch::kUInt8);
}
detail::Executor& held(const torch::Tensor& holder) {
  return **static_cast<std::shared_ptr<detail::Executor>*>(holder.data_ptr());
}

// The whole schedule as one autograd function: forward runs the operations before the loss,
// backward the rest. `anchor` requires grad so that backward runs even when neither the input
// nor anything else entering the function does (parameters are reached by the inner graphs).
struct ScheduleFunction : torch::autograd::Function<ScheduleFunction> {
  static variable_list forward(AutogradContext* ctx, torch::Tensor input, torch::Tensor anchor,
                               std::shared_ptr<detail::Executor> executor) {
    (void)anchor;
    torch::Tensor out = executor->run_forward(input);
    ctx->saved_data["executor"] = hold(std::move(executor));
    ctx->saved_data["input_requires_grad"] = input.requires_grad();
    return {out};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    detail::Executor& executor = held(ctx->saved_data["executor"].toTensor());
    torch::Tensor y0 = executor.run_backward(grads[0]);
    if (!ctx->saved_data["input_requires_grad"].toBool()) y0 = torch::Tensor();
    return {y0, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

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
  solution_.reset();
}

const Solution& CheckpointableImpl::compute_sequence(std::int64_t budget_bytes, Algorithm algorithm) {
  return compute_sequence(SolveOptions(budget_bytes).algorithm(algorithm));
}

const Solution& CheckpointableImpl::compute_sequence(const SolveOptions& options) {
  if (!chain_)
    throw std::invalid_argument(
        "Checkpointable::compute_sequence: no chain yet; call measure(sample) or set_chain()");
  Solution solution = solve(*chain_, options);
  if (!solution.ok())
    throw std::invalid_argument(
        "Checkpointable::compute_sequence: " + std::string(algorithm_name(options.algorithm())) +
        " cannot run in " + std::to_string(options.budget_bytes()) + " bytes; it needs at least " +
        std::to_string(solution.min_feasible_budget_bytes) + " bytes");
  solution_ = std::move(solution);
  return *solution_;
}

const Chain& CheckpointableImpl::chain() const {
  if (!chain_) throw std::logic_error("Checkpointable: no chain yet; call measure(sample) or set_chain()");
  return *chain_;
}

const Solution& CheckpointableImpl::solution() const {
  if (!solution_) throw std::logic_error("Checkpointable: no sequence yet; call compute_sequence(budget)");
  return *solution_;
}

torch::Tensor CheckpointableImpl::forward(torch::Tensor input) {
  if (!is_training() || !torch::GradMode::is_enabled()) return net_->forward(input);
  if (!solution_)
    throw std::logic_error(
        "Checkpointable::forward in training mode needs a sequence: call compute_sequence(budget) "
        "first (or use eval mode / torch::NoGradGuard for inference)");
  auto executor = std::make_shared<detail::Executor>(stages_, solution_->sequence, input.device());
  const torch::Tensor anchor =
      torch::empty({0}, torch::TensorOptions().dtype(input.dtype()).requires_grad(true));
  return ScheduleFunction::apply(input, anchor, executor)[0];
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
