#pragma once
// remat's own autograd nodes (the stages' gradient sinks and sources, the schedule's backward
// node), whichever smart pointer this LibTorch holds a node in: std::shared_ptr up to PyTorch
// 2.12, c10::intrusive_ptr from 2.13 (the headers of 2.12, 2.13 and 2.14 say so; 2.15 was
// built and tested), where torch::autograd::Node derives from
// c10::intrusive_ptr_target and torch::autograd::deleteNode is gone. Told apart by the type of
// torch::autograd::Edge::function, not by version numbers (README.md, "Supported LibTorch
// versions").

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/function.h>

#include <memory>
#include <type_traits>
#include <utility>

namespace remat::detail {

/// What this LibTorch's edges hold a node in: std::shared_ptr<Node> or c10::intrusive_ptr<Node>.
using NodeHandle = decltype(torch::autograd::Edge::function);

/// Whether NodeHandle is std::shared_ptr (PyTorch up to 2.12).
inline constexpr bool kSharedNodes = std::is_same_v<NodeHandle, std::shared_ptr<torch::autograd::Node>>;

template <class Handle, class T>
struct RebindNode;
template <class T>
struct RebindNode<std::shared_ptr<torch::autograd::Node>, T> {
  using type = std::shared_ptr<T>;
};
template <class Node, class Null, class T>
struct RebindNode<c10::intrusive_ptr<Node, Null>, T> {
  using type = c10::intrusive_ptr<T>;
};

/// The handle of a node of type T (a torch::autograd::Node): converts to NodeHandle, and so
/// makes an edge: torch::autograd::Edge(node, input_nr).
template <class T>
using NodePtr = typename RebindNode<NodeHandle, T>::type;

/// A new node of type T, as LibTorch makes its own: with torch::autograd::deleteNode as the
/// deleter where nodes are shared (it frees a long graph behind the node without deep
/// recursion), with c10::make_intrusive where they are intrusive.
template <class T, class... Args>
NodePtr<T> make_node(Args&&... args) {
  static_assert(std::is_base_of_v<torch::autograd::Node, T>, "make_node makes autograd nodes");
  if constexpr (kSharedNodes) {
    // Found by argument-dependent lookup (torch::autograd is the namespace of T's base), so
    // that the name is looked up only where it exists.
    return NodePtr<T>(new T(std::forward<Args>(args)...), [](T* node) { deleteNode(node); });
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

}  // namespace remat::detail
