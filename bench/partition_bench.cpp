// The split of a graph into a chain (remat::partition_graph) against an exhaustive search over
// every split, on small random graphs (tests/solver/partition_graphs.h), judged by the optimal
// solver at a budget halfway between the finest chain's least budget and its store-all peak.
// Prints, for each stage limit: how many graphs, the split's gap to the best split of at most
// that many stages (median, mean, worst), how often the split found no schedule where the best
// did, and how the finest split compares with the best coarser one.
//   remat_partition_bench [--graphs N] [--operations N]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "partition_graphs.h"
#include "remat/solver.h"

namespace {

using remat::GraphPartition;

constexpr double kInfinity = std::numeric_limits<double>::infinity();
using remat::test::every_split;
using remat::test::makespan;

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int graphs = 200, operations = 11;
  for (int k = 1; k < argc; ++k) {
    const bool has_value = k + 1 < argc;
    if (!std::strcmp(argv[k], "--graphs") && has_value) {
      graphs = std::atoi(argv[++k]);
    } else if (!std::strcmp(argv[k], "--operations") && has_value) {
      operations = std::atoi(argv[++k]);
    } else {
      std::fprintf(stderr, "usage: %s [--graphs N] [--operations N]\n", argv[0]);
      return 2;
    }
  }
  if (graphs < 1 || operations < 3 || operations > 16) {
    std::fprintf(stderr, "--graphs must be at least 1, --operations between 3 and 16\n");
    return 2;
  }
  const std::vector<int> limits = {2, 3, 5, 8};
  struct Row {
    std::vector<double> gaps, finest;
    int infeasible = 0;
  };
  std::vector<Row> rows(limits.size());
  for (int seed = 1; seed <= graphs; ++seed) {
    const remat::Graph graph = remat::test::random_graph(static_cast<std::uint32_t>(seed), operations);
    const GraphPartition finest = remat::partition_graph(graph, remat::PartitionOptions(1000));
    const std::int64_t budget = remat::test::middle_budget(remat::graph_chain(graph, finest));
    const double finest_ms = makespan(graph, finest, budget);
    for (std::size_t r = 0; r < limits.size(); ++r) {
      if (limits[r] >= finest.stages()) continue;
      double best = kInfinity;
      for (const GraphPartition& split : every_split(graph, limits[r]))
        best = std::min(best, makespan(graph, split, budget));
      if (best == kInfinity) continue;
      const double ours =
          makespan(graph, remat::partition_graph(graph, remat::PartitionOptions(limits[r])), budget);
      if (ours == kInfinity) {
        ++rows[r].infeasible;
      } else {
        rows[r].gaps.push_back(ours / best - 1);
      }
      rows[r].finest.push_back(finest_ms / best - 1);
    }
  }
  std::printf("%d random graphs of %d operations; gap = makespan / best makespan - 1\n\n", graphs,
              operations);
  std::printf("| at most | graphs | median gap | mean gap | worst gap | no schedule | finest vs best: median | worst |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (std::size_t r = 0; r < limits.size(); ++r) {
    const Row& row = rows[r];
    double mean = 0, worst = 0;
    for (const double gap : row.gaps) {
      mean += gap;
      worst = std::max(worst, gap);
    }
    if (!row.gaps.empty()) mean /= static_cast<double>(row.gaps.size());
    double finest_worst = 0;
    for (const double gap : row.finest) finest_worst = std::max(finest_worst, gap);
    std::printf("| %d | %zu | %.2f%% | %.2f%% | %.2f%% | %d | %.2f%% | %.2f%% |\n", limits[r],
                row.finest.size(), 100 * median(row.gaps), 100 * mean, 100 * worst,
                row.infeasible, 100 * median(row.finest), 100 * finest_worst);
  }
  return 0;
}
