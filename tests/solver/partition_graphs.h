#pragma once
// Graphs for the splitting tests and bench/partition_bench.cpp: hand-made nodes and small
// random forward graphs with skips, in-place operations and tuples.

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "remat/solver/partition.h"
#include "remat/solver/solver.h"

namespace remat::test {

/// A node of `bytes` that reads `reads`; an input where `input`.
inline GraphNode node(std::string name, std::int64_t bytes, std::vector<int> reads,
                      bool input = false) {
  GraphNode out;
  out.name = std::move(name);
  out.bytes = bytes;
  out.reads = std::move(reads);
  out.input = input;
  out.grad = !input;
  return out;
}

/// A random forward graph of `operations` operations after one input (a second, without
/// gradient, one graph in three: labels read by the last operation). Each operation reads the
/// node before it and, one in four, an earlier operation (a skip); one in seven works in place
/// on the node before it (a view of its storage that writes it); one in ten returns a tuple,
/// read by the two operations after it. Sizes from 1 to 40 KiB, forwards from 0.1 to 2 ms,
/// backwards 1.5 to 2.5 times their forward. The last operation is the output.
inline Graph random_graph(std::uint32_t seed, int operations) {
  std::mt19937 rng(seed);
  const auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  const auto chance = [&](double p) { return uniform(0, 1) < p; };
  Graph graph;
  graph.name = "random graph " + std::to_string(seed);
  graph.nodes.push_back(node("x", 4096 * (1 + static_cast<std::int64_t>(uniform(0, 8))), {}, true));
  const bool labels = chance(1.0 / 3);
  if (labels) graph.nodes.push_back(node("labels", 256, {}, true));
  const int first = static_cast<int>(graph.nodes.size());
  for (int k = 0; k < operations; ++k) {
    const int here = static_cast<int>(graph.nodes.size());
    const int previous = here - 1 >= first ? here - 1 : 0;
    GraphNode op = node("op" + std::to_string(k), 1024 * (1 + static_cast<std::int64_t>(uniform(0, 40))),
                        {previous});
    op.fwd_ms = uniform(0.1, 2);
    op.bwd_ms = op.fwd_ms * uniform(1.5, 2.5);
    const GraphNode& before = graph.nodes[static_cast<std::size_t>(previous)];
    const bool tuple_left = k + 2 < operations;
    if (here > first && before.tensor && !before.input && chance(1.0 / 7)) {
      op.name += "_";  // in place: a view of the node before it, which it writes
      op.view_of = previous;
      op.writes = {previous};
      op.bytes = 0;
    } else if (tuple_left && before.tensor && chance(0.1)) {
      graph.nodes.push_back(op);
      GraphNode& pair = graph.nodes.back();
      pair.name += "_pair";
      pair.tensor = false;
      pair.bytes = 0;
      for (int g = 0; g < 2; ++g) {
        GraphNode item = node("op" + std::to_string(k) + "[" + std::to_string(g) + "]",
                              1024 * (1 + static_cast<std::int64_t>(uniform(0, 20))), {here});
        graph.nodes.push_back(item);
      }
      k += 2;
      continue;
    } else if (here - first >= 3 && chance(0.25)) {
      const int skip = first + static_cast<int>(uniform(0, here - first - 1));
      if (graph.nodes[static_cast<std::size_t>(skip)].tensor) op.reads.push_back(skip);
    }
    graph.nodes.push_back(op);
  }
  GraphNode& last = graph.nodes.back();  // a tensor: a tuple is never last
  last.output = true;
  if (labels) last.reads.push_back(1);
  return graph;
}

/// Halfway between the least budget of `chain` and its store-all peak.
inline std::int64_t middle_budget(const Chain& chain) {
  const std::int64_t least = min_feasible_budget(chain, SolveOptions(0).threads(1));
  const std::int64_t most = store_all_peak(chain);
  return least + (most - least) / 2;
}

/// The optimal makespan of a split at `budget`, +infinity where no schedule fits.
inline double makespan(const Graph& graph, const GraphPartition& split, std::int64_t budget) {
  const Solution solution = solve(graph_chain(graph, split), SolveOptions(budget).threads(1));
  return solution.ok() ? solution.makespan_ms : std::numeric_limits<double>::infinity();
}

/// Every split of `graph` (its boundaries a subset of the legal ones) of at most `max_stages`
/// stages: the exhaustive search the split is judged against.
inline std::vector<GraphPartition> every_split(const Graph& graph, int max_stages) {
  std::vector<int> positions;
  const std::vector<bool> legal = legal_boundaries(graph);
  for (std::size_t p = 0; p < legal.size(); ++p)
    if (legal[p]) positions.push_back(static_cast<int>(p));
  std::vector<GraphPartition> splits;
  const auto count = static_cast<std::uint32_t>(positions.size());
  for (std::uint32_t mask = 0; mask < (1u << count); ++mask) {
    GraphPartition split;
    for (std::uint32_t k = 0; k < count; ++k)
      if (mask & (1u << k)) split.ends.push_back(positions[k] + 1);
    split.ends.push_back(static_cast<int>(graph.nodes.size()));
    if (split.stages() <= max_stages) splits.push_back(std::move(split));
  }
  return splits;
}

}  // namespace remat::test
