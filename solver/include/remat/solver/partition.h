#pragma once
/// Splitting a forward graph into a chain of stages (docs/algorithms.md, "Splitting a graph
/// into a chain"): the graph of any model, captured by the Python package or read from a
/// `remat-graph/1` file, becomes the chain the dynamic program solves.
///
/// Example:
///   remat::Graph graph = remat::load_graph("gpt2.graph.json");
///   remat::GraphPartition split = remat::partition_graph(graph, remat::PartitionOptions(300));
///   remat::Chain chain = remat::graph_chain(graph, split);

#include <cstdint>
#include <string>
#include <vector>

#include "remat/base/arg.h"
#include "remat/solver/chain.h"

namespace remat {

/// Format tag of graph files.
inline constexpr const char* kGraphFormat = "remat-graph/1";

/// Most nodes a graph may have: a 12-layer GPT-2 captured operation by operation has about
/// 900; splitting is linear in the nodes and their reads, but a chain is solved from at most
/// kMaxStages stages.
inline constexpr int kMaxGraphNodes = 1000000;

/// One value of a forward graph: a graph input, or an operation and the value it returns.
struct GraphNode {
  std::string name;
  /// Whether it is an input of the graph (the caller's tensors); inputs come first.
  bool input = false;
  /// Whether its value is one tensor. A tuple, an integer or nothing cannot cross a stage
  /// boundary: every node that reads it is in its stage.
  bool tensor = true;
  /// Bytes of its value's storage (0 for a value that is not a tensor; ignored for a view).
  std::int64_t bytes = 0;
  /// -1 where its value has a storage of its own; else the earlier node whose storage it
  /// views (a reshape, a transpose, an in-place operation's result): the storage is counted
  /// once, wherever its views go.
  int view_of = -1;
  /// Whether its value has a gradient (a floating-point tensor that depends on a parameter or
  /// on an input that requires one).
  bool grad = true;
  /// Estimated forward and backward times in milliseconds (only their ratios to each other
  /// and to the sizes guide the split; the stages are measured afterwards).
  double fwd_ms = 0;
  double bwd_ms = 0;
  /// Earlier nodes whose values it reads.
  std::vector<int> reads;
  /// Earlier nodes whose storage it writes in place (directly, or through a view of them): a
  /// stage never modifies its input, so each is in its stage.
  std::vector<int> writes;
  /// Earlier operations that must be in its stage: an operation that returns its argument
  /// itself or a view of it depending on the argument's layout (`contiguous`, `to`), which
  /// would make a stage's output its input (carried) or not depending on how it is handed.
  std::vector<int> stays_with;
  /// Whether the graph returns its value.
  bool output = false;
};

/// A forward graph in a topological order: every node reads and writes only earlier nodes.
struct Graph {
  std::string name;
  std::vector<GraphNode> nodes;

  /// Checks the invariants above (indices, order, sizes within kMaxChainBytes, times within
  /// kMaxStageMs, at least one operation); throws ChainError naming `source` and the node.
  void validate(const std::string& source = "graph") const;
  /// Number of input nodes (they come first).
  int input_count() const;
};

/// How a graph is split.
struct PartitionOptions {
  explicit PartitionOptions(int max_stages = 300) : max_stages_(max_stages) {}
  /// The most stages of the chain: the finest legal split where it has no more, else the
  /// boundaries least worth keeping are removed until it has that many.
  REMAT_ARG(int, max_stages);
};

/// A split of a graph's operations into consecutive stages.
struct GraphPartition {
  /// One past the last node of each stage, increasing; the last is the node count. Stage k
  /// holds the nodes [ends[k-1], ends[k]) (the first stage starts after the inputs).
  std::vector<int> ends;
  /// Bytes of the tensors that cross each boundary (x_1 ... x_L, as the chain's activations
  /// count them).
  std::vector<std::int64_t> boundary_bytes;
  /// The number of legal boundaries the graph had (the finest split has one stage more).
  int legal_boundaries = 0;

  int stages() const { return static_cast<int>(ends.size()); }
};

/// Whether a boundary may follow node p, for each p (index p: between nodes p and p+1): not
/// among the inputs, not inside a value that cannot cross, not between a node and the node that
/// writes its storage, nor between a node and one it must stay with (`stays_with`), nor where
/// two values of one storage cross together (a profiled stage's output that views another
/// member counts as a storage of its own). The last entry is false (the graph's end is not a
/// boundary).
std::vector<bool> legal_boundaries(const Graph& graph);

/// Bytes of the tensors that cross the boundary after node p, for each p: values produced at
/// or before p and read after p or returned by the graph, each storage counted once.
std::vector<std::int64_t> crossing_bytes(const Graph& graph);

/// The split: the finest legal one with at most `options.max_stages()` stages. Where the
/// graph has more legal boundaries, those least worth keeping as checkpoints are removed
/// first: the widest relative to the compute they separate (docs/algorithms.md). Throws
/// std::invalid_argument for an invalid graph or options.
GraphPartition partition_graph(const Graph& graph, const PartitionOptions& options);

/// The chain of a split, from the graph's estimates: each stage's times are its nodes' sums;
/// x_k holds the tensors crossing boundary k (a tensor read further on is carried, counted
/// once); a stage's backward keeps what it reads from x_k, its new outputs and every value
/// made inside it. An estimate for planning and for `remat split`; the Python package measures
/// the stages instead.
Chain graph_chain(const Graph& graph, const GraphPartition& partition);

/// Parses and validates a `remat-graph/1` document; `source` names it in error messages.
Graph parse_graph(const std::string& json_text, const std::string& source = "graph");
/// Reads and validates a graph file. Throws ChainError (file missing, not JSON, invalid).
Graph load_graph(const std::string& path);
/// Serializes a graph as a `remat-graph/1` document.
std::string graph_to_json(const Graph& graph);

}  // namespace remat
