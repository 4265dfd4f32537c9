#pragma once
// How the profiler and the runtime hand a stage its input when it runs with autograd: the
// value's storage under a new tensor whose grad_fn is a sink for the input's gradient. Not a
// leaf: a leaf's gradient accumulator is part of every graph that uses it and holds the leaf,
// so the input would stay alive until the stage's backward whether that backward needs it or
// not. With a sink, the graph keeps the input only if one of its nodes saved it, as inside
// plain autograd, and the profiler can see which. An activation of several members gets one
// such input (and one sink) per member that has a gradient.

#include "remat/core/autograd_node.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace remat::detail {

/// A stage input's gradient as the runtime keeps it: its own storage. A backward may return a
/// view of a larger gradient (the slice of a concatenation's gradient that belongs to one of
/// its inputs), which would hold the whole storage for as long as the gradient lives; such a
/// view is copied (the copy's moment is part of the stage's backward memory). A copy of a slice
/// with gaps between its rows (a concatenation's slice along any dimension but the first) keeps
/// them, a little narrower: the kernels that read the gradient next choose their path, and with
/// it their rounding, by its layout (BatchNorm's CPU backward has a faster kernel for a contiguous
/// gradient, which sums in another order), so a contiguous copy would change the gradients
/// against plain autograd (stage_input.cpp, compact_layout). A view of the whole storage (a
/// reshape's gradient) becomes a plain tensor on it: as a view it would keep its base, a second
/// holder of the storage, and autograd adds a later contribution in place only into a storage it
/// holds alone (a new sum otherwise, which the profiler, measuring with plain gradients, would not
/// have seen).
torch::Tensor compact_gradient(torch::Tensor gradient);

/// Receives a stage input's gradient when the stage's backward reaches it: keeps it, or, once
/// pass_to() has linked it to the stage that made the input, passes it on to that stage's graph
/// (the runtime's backward over several stages in one engine call), compacted as the runtime
/// would have kept it.
struct GradientSink : torch::autograd::Node {
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (on_gradient) on_gradient();
    if (passes_on_) return {compact_gradient(std::move(grads[0]))};
    gradient = std::move(grads[0]);
    return {};
  }
  std::string name() const override { return "remat::GradientSink"; }
  /// From now on the gradient goes to `edge` (an invalid edge: nowhere) instead of `gradient`.
  /// Once, before the backward.
  void pass_to(torch::autograd::Edge edge) {
    // Not add_next_edge(): it refuses a node that is already some node's next (the stage's graph
    // points here), to keep topological numbers ordered. The engine reads them only for a
    // backward restricted to some inputs (autograd.grad's `inputs`), which never runs through
    // the runtime's sinks.
    next_edges_.push_back(std::move(edge));
    passes_on_ = true;
  }
  torch::Tensor gradient;
  /// Called first when the gradient arrives, on the thread that runs the backward (the
  /// profiler marks the end of a stage's backward with it).
  std::function<void()> on_gradient;

 private:
  bool passes_on_ = false;
};

/// A stage input: the tensor to call the stage with, and the sink of its gradient (null when
/// no gradient is wanted: then the tensor does not require grad).
struct StageInput {
  torch::Tensor tensor;
  NodePtr<GradientSink> sink;
};

/// `value`'s storage as a stage input, with a gradient sink if `gradient`.
inline StageInput stage_input(const torch::Tensor& value, bool gradient) {
  StageInput out{value.detach(), nullptr};
  if (gradient) {
    out.sink = make_node<GradientSink>();
    out.sink->add_input_metadata(out.tensor);
    torch::autograd::impl::set_gradient_edge(out.tensor, torch::autograd::Edge(out.sink, 0));
  }
  return out;
}

/// Runs the backward of a stage from the graph edges of its output members with their
/// gradients (one per edge, all defined), which are moved in and freed as soon as the first
/// node has used them (a gradient passed to the engine as a root input would be held by the
/// caller's list until the whole backward ends). Grad mode off, as in any backward; parameter
/// gradients accumulate. Nothing to do for no edges.
void run_backward(std::vector<torch::autograd::Edge> edges, std::vector<torch::Tensor> gradients);

/// run_backward for a backward asked for some tensors only (torch.autograd.grad,
/// backward(inputs=...)): accumulates nothing, and returns the gradients that reach `capture`
/// (edges to leaves: a stage input's sink, a parameter's accumulator; undefined where none
/// arrives), the engine computing only what they need. The sinks in `capture` do not run.
std::vector<torch::Tensor> run_backward_capturing(std::vector<torch::autograd::Edge> edges,
                                                  std::vector<torch::Tensor> gradients,
                                                  const std::vector<torch::autograd::Edge>& capture);

/// How many engine calls run_backward() has made in this process (for tests).
std::int64_t backward_calls();

}  // namespace remat::detail
