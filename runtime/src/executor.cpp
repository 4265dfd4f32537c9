#include "executor.h"

#include <ATen/Context.h>
#include <torch/autograd.h>
#include <torch/nn/module.h>

#include <mutex>
#include <stdexcept>
#include <string>

namespace remat::detail {
namespace {

at::Generator default_generator(c10::Device device) {
  if (device.is_cuda() && !device.has_index()) device = c10::Device(c10::kCUDA, 0);
  return at::globalContext().defaultGenerator(device);
}
torch::Tensor generator_state(c10::Device device) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}
void set_generator_state(c10::Device device, const torch::Tensor& state) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

[[noreturn]] void bug(const std::string& what) {
  throw std::logic_error("remat runtime: " + what + " (this is a bug in remat; please report it)");
}

}  // namespace

Executor::Executor(const std::vector<NamedStage>& stages, const Sequence& sequence,
                   c10::Device device)
    : stages_(stages), sequence_(sequence), device_(device),
      length_(static_cast<int>(stages.size())) {
  const auto n = static_cast<std::size_t>(length_) + 1;
  x_.resize(n);
  checkpoint_.assign(n, false);
  fe_in_.resize(n);
  fe_out_.resize(n);
  y_.resize(n);
  ran_.assign(n, false);
  cpu_rng_.resize(n);
  cuda_rng_.resize(n);
  buffer_snapshot_.resize(n);
  restore_after_backward_.assign(n, false);
  loss_index_ = sequence.size();
  for (std::size_t k = 0; k < sequence.size(); ++k)
    if (sequence[k].kind == OpKind::kLoss) loss_index_ = k;
  if (loss_index_ == sequence.size()) bug("the sequence has no loss operation");
}

torch::Tensor Executor::input_of(int i) const {
  const auto ui = static_cast<std::size_t>(i);
  if (x_[ui].defined()) return x_[ui];
  if (i > 0 && fe_out_[ui - 1].defined()) return fe_out_[ui - 1].detach();
  bug("the input of stage " + std::to_string(i) + " is not in memory");
}

torch::Tensor Executor::call(int i, const torch::Tensor& x) {
  // AnyModule::forward is not const; the holder is not changed.
  auto& module = const_cast<torch::nn::AnyModule&>(stages_[static_cast<std::size_t>(i)].module);
  return module.forward<torch::Tensor>(x);
}

void Executor::before_forward(int i, bool keeps_graph) {
  const auto ui = static_cast<std::size_t>(i);
  if (!ran_[ui]) {
    ran_[ui] = true;
    cpu_rng_[ui] = generator_state(c10::Device(c10::kCPU));
    if (device_.is_cuda()) cuda_rng_[ui] = generator_state(device_);
    return;
  }
  caller_cpu_rng_ = generator_state(c10::Device(c10::kCPU));
  set_generator_state(c10::Device(c10::kCPU), cpu_rng_[ui]);
  if (device_.is_cuda()) {
    caller_cuda_rng_ = generator_state(device_);
    set_generator_state(device_, cuda_rng_[ui]);
  }
  if (buffer_snapshot_[ui].empty()) {
    torch::NoGradGuard no_grad;
    for (const auto& b : stages_[ui].module.ptr()->buffers()) buffer_snapshot_[ui].push_back(b.clone());
  }
  (void)keeps_graph;
}

void Executor::after_forward(int i, bool keeps_graph) {
  const auto ui = static_cast<std::size_t>(i);
  if (!caller_cpu_rng_.defined()) return;  // the stage's first forward
  set_generator_state(c10::Device(c10::kCPU), caller_cpu_rng_);
  caller_cpu_rng_ = torch::Tensor();
  if (device_.is_cuda()) {
    set_generator_state(device_, caller_cuda_rng_);
    caller_cuda_rng_ = torch::Tensor();
  }
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
  for (std::size_t k = 0; k < buffers.size(); ++k) buffers[k].copy_(buffer_snapshot_[ui][k]);
  buffer_snapshot_[ui].clear();
  restore_after_backward_[ui] = false;
}

void Executor::run(const Op& op) {
  const int i = op.stage;
  const auto ui = static_cast<std::size_t>(i);
  switch (op.kind) {
    case OpKind::kForwardGrad: {
      before_forward(i, true);
      torch::AutoGradMode grad(true);
      torch::Tensor in = input_of(i).detach().requires_grad_(true);
      torch::Tensor out = call(i, in);
      fe_in_[ui] = std::move(in);
      fe_out_[ui] = std::move(out);
      after_forward(i, true);
      break;
    }
    case OpKind::kForwardNoGrad:
    case OpKind::kForwardCheckpoint: {
      before_forward(i, false);
      torch::Tensor out;
      {
        torch::NoGradGuard no_grad;
        out = call(i, input_of(i));
      }
      x_[ui + 1] = std::move(out);
      if (op.kind == OpKind::kForwardCheckpoint)
        checkpoint_[ui] = true;
      else if (!checkpoint_[ui] && i != 0)
        x_[ui].reset();
      after_forward(i, false);
      break;
    }
    case OpKind::kLoss: {
      const auto ul = static_cast<std::size_t>(length_);
      if (x_[ul].defined()) {
        output_ = x_[ul];
        x_[ul].reset();
      } else if (fe_out_[ul - 1].defined()) {
        output_ = fe_out_[ul - 1].detach();
      } else {
        bug("the chain's output is not in memory at the loss");
      }
      break;
    }
    case OpKind::kBackward: {
      torch::Tensor& out = fe_out_[ui];
      torch::Tensor& in = fe_in_[ui];
      if (!out.defined() || !y_[ui + 1].defined())
        bug("B_" + std::to_string(i) + " without its forward or its output's gradient");
      {
        torch::AutoGradMode grad(true);
        torch::autograd::backward({out}, {y_[ui + 1]});
      }
      y_[ui] = in.grad();
      in.mutable_grad().reset();
      out.reset();
      in.reset();
      y_[ui + 1].reset();
      x_[ui].reset();
      if (restore_after_backward_[ui]) restore_buffers(i);
      break;
    }
  }
}

torch::Tensor Executor::run_forward(const torch::Tensor& input) {
  x_[0] = input.detach();
  for (std::size_t k = 0; k < loss_index_; ++k) run(sequence_[k]);
  run(sequence_[loss_index_]);
  torch::Tensor out = output_;
  output_ = torch::Tensor();
  return out;
}

torch::Tensor Executor::run_backward(const torch::Tensor& grad_output) {
  if (backward_done_)
    throw std::runtime_error(
        "remat: the backward of this step's schedule already ran; a checkpointed forward can "
        "be backpropagated once (retain_graph is not supported)");
  backward_done_ = true;
  y_[static_cast<std::size_t>(length_)] = grad_output;
  for (std::size_t k = loss_index_ + 1; k < sequence_.size(); ++k) run(sequence_[k]);
  torch::Tensor y0 = y_[0];
  y_[0] = torch::Tensor();
  x_[0] = torch::Tensor();
  return y0;
}

}  // namespace remat::detail
