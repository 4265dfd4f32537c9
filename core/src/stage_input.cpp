#include "remat/core/stage_input.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

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

// The layout compact_gradient copies a view with gaps into (its `strides` and `offset` in a
// storage of `elements` elements of its own): each dimension's stride at least what the
// dimensions inside it span, with a gap where the view has one (one of as few elements as
// keeps each element's address the same modulo 64 bytes: the allocators align a storage to at
// least that), so that the copy has the view's order of strides, contiguous runs and
// alignment. Dimensions of one element keep their strides. None (an empty optional) where the
// view is dense, overlaps or is empty: then a plain clone is its copy.
struct CompactLayout {
  std::vector<std::int64_t> strides;
  std::int64_t offset = 0;
  std::int64_t elements = 0;
};

std::optional<CompactLayout> compact_layout(const torch::Tensor& view) {
  if (view.numel() == 0 || view.is_non_overlapping_and_dense()) return std::nullopt;
  const std::int64_t element = static_cast<std::int64_t>(view.element_size());
  // The alignment kept, in bytes and in elements.
  constexpr std::int64_t kAlignment = 64;
  const std::int64_t align = kAlignment % element == 0 ? kAlignment / element : 1;
  // The dimensions of more than one element, innermost first (of equal strides, the later).
  std::vector<std::int64_t> order;
  for (std::int64_t d = view.dim() - 1; d >= 0; --d)
    if (view.size(d) > 1) order.push_back(d);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::int64_t a, std::int64_t b) { return view.stride(a) < view.stride(b); });
  CompactLayout layout{view.strides().vec()};
  const auto address = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(view.data_ptr()) %
                                                 static_cast<std::uintptr_t>(kAlignment));
  layout.offset = address % element == 0 ? address / element : 0;
  // What the dimensions inside the next one span, in the copy and in the view.
  std::int64_t span = 1, view_span = 1, last = 0;
  for (const std::int64_t d : order) {
    const std::int64_t stride = view.stride(d);
    if (stride < view_span) return std::nullopt;  // it overlaps
    std::int64_t own = span;
    if (stride != view_span) {  // a gap: the narrowest with the view's alignment
      own += ((stride - span) % align + align) % align;
      if (own == span) own += align;
    }
    layout.strides[static_cast<std::size_t>(d)] = own;
    last += (view.size(d) - 1) * own;
    span = own * view.size(d);
    view_span = stride * view.size(d);
  }
  layout.elements = layout.offset + last + 1;
  return layout;
}

}  // namespace

torch::Tensor compact_gradient(torch::Tensor gradient) {
  if (!gradient.defined()) return gradient;
  if (gradient.storage().nbytes() >
      static_cast<std::size_t>(gradient.numel()) * gradient.element_size()) {
    const std::optional<CompactLayout> layout = compact_layout(gradient);
    if (!layout) return gradient.clone();
    // Not where it is that copy already (a gradient kept so, passed on over a stage that only
    // carries it): the layout of a copy is its own.
    if (static_cast<std::size_t>(layout->elements) * gradient.element_size() <
        gradient.storage().nbytes()) {
      torch::NoGradGuard no_grad;
      torch::Tensor copy = torch::empty({0}, gradient.options());
      copy.set_(torch::empty({layout->elements}, gradient.options()).storage(), layout->offset,
                gradient.sizes(), layout->strides);
      copy.copy_(gradient);
      return copy;
    }
  }
  if (gradient.is_view()) {
    torch::NoGradGuard no_grad;
    torch::Tensor plain = torch::empty({0}, gradient.options());
    plain.set_(gradient.storage(), gradient.storage_offset(), gradient.sizes(), gradient.strides());
    return plain;
  }
  return gradient;
}

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
