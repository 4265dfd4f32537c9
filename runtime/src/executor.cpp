#include "executor.h"

#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/nn/module.h>

#include <stdexcept>
#include <string>

#include "remat/profiler/generator_state.h"

namespace remat::detail {
namespace {

// Generator states and buffer snapshots are kept in host memory outside LibTorch's
// allocators: they are bookkeeping, not activations, and must not count against the budget
// (a CPU generator state is 5 KB per stage that draws random numbers).
HostCopy host_generator_state(c10::Device device) { return HostCopy(generator_state(device)); }

[[noreturn]] void bug(const std::string& what) {
  throw std::logic_error("remat runtime: " + what + " (this is a bug in remat; please report it)");
}

}  // namespace

Executor::Executor(const std::vector<NamedStage>& stages, const Sequence& sequence,
                   c10::Device device)
    : stages_(stages), sequence_(sequence), device_(device),
      length_(static_cast<int>(stages.size())) {
  const auto n = static_cast<std::size_t>(length_) + 1;
  lifetimes_ = value_lifetimes(sequence, length_);
  x_.resize(n);
  fe_edge_.resize(n);
  fe_sink_.resize(n);
  y_.resize(n);
  ran_.assign(n, false);
  cpu_rng_.resize(n);
  cuda_rng_.resize(n);
  buffer_snapshot_.resize(n);
  restore_after_backward_.assign(n, false);
  recomputed_.assign(n, false);
  std::vector<int> forwards(n, 0);
  for (const Op& op : sequence)
    if (op.is_forward())
      recomputed_[static_cast<std::size_t>(op.stage)] =
          ++forwards[static_cast<std::size_t>(op.stage)] > 1;
  loss_index_ = sequence.size();
  for (std::size_t k = 0; k < sequence.size(); ++k)
    if (sequence[k].kind == OpKind::kLoss) loss_index_ = k;
  if (loss_index_ == sequence.size()) bug("the sequence has no loss operation");
}

torch::Tensor Executor::input_of(int i) const {
  const auto ui = static_cast<std::size_t>(i);
  if (x_[ui].defined()) return x_[ui];
  bug("the input of stage " + std::to_string(i) + " is not in memory");
}

void Executor::drop_values(std::size_t index) {
  const Op& op = sequence_[index];
  const auto input = static_cast<std::size_t>(op.kind == OpKind::kLoss ? length_ : op.stage);
  if (input > 0 && !lifetimes_.keep_input[index]) x_[input].reset();
  if (op.is_forward() && !lifetimes_.keep_output[index]) x_[input + 1].reset();
}

torch::Tensor Executor::call(int i, const torch::Tensor& x) {
  // AnyModule::forward is not const; the holder is not changed.
  auto& module = const_cast<torch::nn::AnyModule&>(stages_[static_cast<std::size_t>(i)].module);
  return module.forward<torch::Tensor>(x);
}

void Executor::before_forward(int i) {
  const auto ui = static_cast<std::size_t>(i);
  if (!ran_[ui]) {
    // Only a stage that the sequence runs again needs its random state (store-all: none).
    if (!recomputed_[ui]) return;
    cpu_rng_[ui] = host_generator_state(c10::Device(c10::kCPU));
    if (device_.is_cuda()) cuda_rng_[ui] = host_generator_state(device_);
    return;
  }
  if (!cpu_rng_[ui].empty()) {
    caller_cpu_rng_ = host_generator_state(c10::Device(c10::kCPU));
    set_generator_state(c10::Device(c10::kCPU), cpu_rng_[ui].tensor());
  }
  if (!cuda_rng_[ui].empty()) {
    caller_cuda_rng_ = host_generator_state(device_);
    set_generator_state(device_, cuda_rng_[ui].tensor());
  }
  if (buffer_snapshot_[ui].empty()) {
    torch::NoGradGuard no_grad;
    for (const auto& b : stages_[ui].module.ptr()->buffers()) buffer_snapshot_[ui].emplace_back(b);
  }
}

void Executor::after_forward(int i, bool keeps_graph) {
  const auto ui = static_cast<std::size_t>(i);
  if (!ran_[ui]) {
    // The stage's first forward: keep its generator states only if it drew random numbers
    // (each is a few kilobytes of memory per stage, held until the step's backward ends).
    ran_[ui] = true;
    if (!recomputed_[ui]) return;
    if (cpu_rng_[ui] == host_generator_state(c10::Device(c10::kCPU))) cpu_rng_[ui] = HostCopy();
    if (!cuda_rng_[ui].empty() && cuda_rng_[ui] == host_generator_state(device_)) cuda_rng_[ui] = HostCopy();
    return;
  }
  if (!caller_cpu_rng_.empty()) set_generator_state(c10::Device(c10::kCPU), caller_cpu_rng_.tensor());
  if (!caller_cuda_rng_.empty()) set_generator_state(device_, caller_cuda_rng_.tensor());
  caller_cpu_rng_ = HostCopy();
  caller_cuda_rng_ = HostCopy();
  if (keeps_graph)
    restore_after_backward_[ui] = true;  // autograd saved the buffers: after B_i
  else
    restore_buffers(i);
}

void Executor::restore_buffers(int i) {
  const auto ui = static_cast<std::size_t>(i);
  if (buffer_snapshot_[ui].empty()) return;
  torch::NoGradGuard no_grad;
  const auto buffers = stages_[ui].module.ptr()->buffers();
  for (std::size_t k = 0; k < buffers.size(); ++k) buffers[k].copy_(buffer_snapshot_[ui][k].tensor());
  buffer_snapshot_[ui].clear();
  restore_after_backward_[ui] = false;
}

void Executor::run(std::size_t index) {
  const Op& op = sequence_[index];
  const int i = op.stage;
  const auto ui = static_cast<std::size_t>(i);
  switch (op.kind) {
    case OpKind::kForwardGrad: {
      before_forward(i);
      torch::AutoGradMode grad(true);
      // The stage's input: the value's storage under a new tensor whose grad_fn is a sink for
      // its gradient. Not a leaf: a leaf's gradient accumulator would keep the input alive
      // for as long as the graph, whether its backward needs it or not. The chain's input
      // gets a gradient only if the caller's input wants one (plain autograd skips the first
      // stage's input gradient otherwise, and so do we).
      StageInput input = stage_input(input_of(i), i > 0 || input_requires_grad_);
      fe_sink_[ui] = std::move(input.sink);
      torch::Tensor in = std::move(input.tensor);
      torch::Tensor out = call(i, in);
      in.reset();
      if (out.requires_grad()) fe_edge_[ui] = torch::autograd::impl::gradient_edge(out);
      x_[ui + 1] = out.detach();
      out.reset();
      after_forward(i, true);
      break;
    }
    case OpKind::kForwardNoGrad:
    case OpKind::kForwardCheckpoint: {
      before_forward(i);
      torch::Tensor out;
      {
        torch::NoGradGuard no_grad;
        out = call(i, input_of(i));
      }
      x_[ui + 1] = std::move(out);
      after_forward(i, false);
      break;
    }
    case OpKind::kLoss: {
      const auto ul = static_cast<std::size_t>(length_);
      if (!x_[ul].defined()) bug("the chain's output is not in memory at the loss");
      output_ = x_[ul];
      break;
    }
    case OpKind::kBackward: {
      if (!y_[ui + 1].defined()) bug("B_" + std::to_string(i) + " without its output's gradient");
      torch::autograd::Edge edge = std::move(fe_edge_[ui]);
      std::shared_ptr<GradientSink> sink = std::move(fe_sink_[ui]);
      if (edge.is_valid()) detail::run_backward(std::move(edge), std::move(y_[ui + 1]));
      y_[ui + 1].reset();
      if (sink) {
        y_[ui] = std::move(sink->gradient);
        sink.reset();
      }
      if (restore_after_backward_[ui]) restore_buffers(i);
      break;
    }
  }
  drop_values(index);
}

void Executor::abandon() noexcept {
  try {
    if (!caller_cpu_rng_.empty()) set_generator_state(c10::Device(c10::kCPU), caller_cpu_rng_.tensor());
    if (!caller_cuda_rng_.empty()) set_generator_state(device_, caller_cuda_rng_.tensor());
    for (int i = 0; i < length_; ++i) restore_buffers(i);
  } catch (...) {
    // Restoring from host copies allocates little; if even that fails, the original error
    // is the one to report.
  }
  caller_cpu_rng_ = HostCopy();
  caller_cuda_rng_ = HostCopy();
  for (auto* tensors : {&x_, &y_})
    for (torch::Tensor& t : *tensors) t = torch::Tensor();
  for (auto& edge : fe_edge_) edge = torch::autograd::Edge();
  for (auto& sink : fe_sink_) sink.reset();
  output_ = torch::Tensor();
}

torch::Tensor Executor::run_forward(const torch::Tensor& input) {
  c10::OptionalDeviceGuard device_guard;
  if (device_.is_cuda()) device_guard.reset_device(device_);
  try {
    input_requires_grad_ = input.requires_grad();
    x_[0] = input.detach();
    for (std::size_t k = 0; k <= loss_index_; ++k) run(k);
  } catch (...) {
    abandon();
    throw;
  }
  torch::Tensor out = output_;
  output_ = torch::Tensor();
  return out;
}

torch::Tensor Executor::run_backward(torch::Tensor grad_output) {
  c10::OptionalDeviceGuard device_guard;
  if (device_.is_cuda()) device_guard.reset_device(device_);
  try {
    y_[static_cast<std::size_t>(length_)] = std::move(grad_output);
    for (std::size_t k = loss_index_ + 1; k < sequence_.size(); ++k) run(k);
  } catch (...) {
    abandon();
    throw;
  }
  torch::Tensor y0 = y_[0];
  y_[0] = torch::Tensor();
  x_[0] = torch::Tensor();
  return y0;
}

}  // namespace remat::detail
