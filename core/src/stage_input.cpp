#include "remat/core/stage_input.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>

#include <atomic>
#include <utility>

namespace remat::detail {
namespace {

// The root of a stage's backward: hands over the gradients it holds, once, to the output
// members' grad_fns. The engine starts it with an empty seed (what it is given as root inputs
// stays referenced by the caller until the backward ends: zero bytes, not the gradients).
struct GradientSource : torch::autograd::Node {
  GradientSource(torch::autograd::edge_list next, std::vector<torch::Tensor> gradients)
      : torch::autograd::Node(std::move(next)), gradients_(std::move(gradients)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&&) override {
    return std::move(gradients_);
  }
  std::string name() const override { return "remat::GradientSource"; }
  std::vector<torch::Tensor> gradients_;
};

std::atomic<std::int64_t> calls{0};

}  // namespace

std::int64_t backward_calls() { return calls.load(); }

void run_backward(std::vector<torch::autograd::Edge> edges, std::vector<torch::Tensor> gradients) {
  TORCH_CHECK(edges.size() == gradients.size(), "remat::detail::run_backward: ", edges.size(),
              " edges but ", gradients.size(), " gradients");
  if (edges.empty()) return;
  ++calls;
  const torch::Tensor seed = torch::empty({0}, gradients.front().options().requires_grad(false));
  auto source = make_node<GradientSource>(std::move(edges), std::move(gradients));
  source->add_input_metadata(seed);
  torch::autograd::Engine::get_default_engine().execute(
      {torch::autograd::Edge(std::move(source), 0)}, {seed}, /*keep_graph=*/false,
      /*create_graph=*/false, /*accumulate_grad=*/true);
}

std::vector<torch::Tensor> run_backward_capturing(std::vector<torch::autograd::Edge> edges,
                                                  std::vector<torch::Tensor> gradients,
                                                  const std::vector<torch::autograd::Edge>& capture) {
  TORCH_CHECK(edges.size() == gradients.size(), "remat::detail::run_backward_capturing: ",
              edges.size(), " edges but ", gradients.size(), " gradients");
  if (edges.empty() || capture.empty()) return std::vector<torch::Tensor>(capture.size());
  ++calls;
  const torch::Tensor seed = torch::empty({0}, gradients.front().options().requires_grad(false));
  auto source = make_node<GradientSource>(std::move(edges), std::move(gradients));
  source->add_input_metadata(seed);
  return torch::autograd::Engine::get_default_engine().execute(
      {torch::autograd::Edge(std::move(source), 0)}, {seed}, /*keep_graph=*/false,
      /*create_graph=*/false, /*accumulate_grad=*/false, capture);
}

}  // namespace remat::detail
