// remat split: a forward graph (remat-graph/1) split into a chain of stages, printed as a table
// of its stages and written as a chain file (docs/cli.md, "remat split").
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "cli.h"

namespace remat::cli {
namespace {

struct SplitArgs {
  std::string graph_path;
  int max_stages = 300;
  std::string output;
  std::string format = "text";
};

// The stage's first and last node names, as a range.
std::string node_range(const Graph& graph, int begin, int end) {
  const std::string first = printable(graph.nodes[static_cast<std::size_t>(begin)].name);
  if (end - begin == 1) return first;
  return first + " .. " + printable(graph.nodes[static_cast<std::size_t>(end - 1)].name);
}

}  // namespace

Action add_split_command(CLI::App& app) {
  auto args = std::make_shared<SplitArgs>();
  CLI::App* cmd =
      app.add_subcommand("split", "Split a forward graph (remat-graph/1) into a chain of stages");
  cmd->add_option("--graph", args->graph_path, "Graph file (remat-graph/1 JSON)")->required();
  cmd->add_option("--max-stages", args->max_stages,
                  "Most stages of the chain (the finest legal split where it has no more)")
      ->capture_default_str();
  cmd->add_option("-o,--output", args->output, "Write the chain to FILE (atomically)");
  cmd->add_option("--format", args->format, "Output: text or json")->capture_default_str();
  return [args]() -> int {
    const Format format = parse_format(args->format);
    REMAT_CHECK(args->max_stages >= 1 && args->max_stages <= kMaxStages, "--max-stages (",
                args->max_stages, ") must be between 1 and ", kMaxStages);
    const Graph graph = load_graph(args->graph_path);
    const GraphPartition split = partition_graph(graph, PartitionOptions(args->max_stages));
    const Chain chain = graph_chain(graph, split);
    if (!args->output.empty()) save_chain(chain, args->output);
    if (format == Format::kJson) {
      nlohmann::json out;
      out["graph"] = graph.name;
      out["nodes"] = graph.nodes.size();
      out["legal_boundaries"] = split.legal_boundaries;
      out["ends"] = split.ends;
      out["boundary_bytes"] = split.boundary_bytes;
      fmt::print("{}\n", out.dump(2));
      return kExitOk;
    }
    fmt::print("graph        {} ({}, {}, {} legal boundar{})\n", printable(graph.name),
               counted(static_cast<std::int64_t>(graph.nodes.size()), "node"),
               counted(graph.input_count(), "input"), split.legal_boundaries,
               split.legal_boundaries == 1 ? "y" : "ies");
    fmt::print("chain        {} stage{}, at most {}\n", split.stages(),
               split.stages() == 1 ? "" : "s", args->max_stages);
    fmt::print("\n{:>5}  {:>10}  {:>10}  {:>12}  {}\n", "stage", "fwd ms", "bwd ms",
               "output", "nodes");
    int begin = graph.input_count();
    for (int k = 0; k < split.stages(); ++k) {
      const Stage& stage = chain.stages[static_cast<std::size_t>(k)];
      const int end = split.ends[static_cast<std::size_t>(k)];
      fmt::print("{:>5}  {:>10.3f}  {:>10.3f}  {:>12}  {}\n", k, stage.fwd_ms, stage.bwd_ms,
                 format_bytes(split.boundary_bytes[static_cast<std::size_t>(k)]),
                 node_range(graph, begin, end));
      begin = end;
    }
    if (!args->output.empty()) fmt::print("\nwritten      {}\n", printable(args->output));
    return kExitOk;
  };
}

}  // namespace remat::cli
