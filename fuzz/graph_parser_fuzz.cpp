// The graph file parser (`remat-graph/1`, `remat split`) on any bytes, then the split and its
// chain: a ChainError (bad input) or a graph that writes back to JSON that parses to the same
// graph, whose finest split and chain are valid. Anything else (a crash, a sanitizer report,
// another exception) is a finding, and so are: an error message with a control character (a
// file's escape sequence would reach the terminal) or longer than 1,000 bytes (the file quoted
// whole), and a graph read from bytes with a NUL (what follows it ignored).
#include <cstddef>
#include <cstdint>
#include <string>

#include "findings.h"
#include "remat/solver/chain.h"
#include "remat/solver/partition.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  remat::Graph graph;
  try {
    graph = remat::parse_graph(text, "fuzz");
  } catch (const remat::ChainError& error) {
    remat::fuzz::trap_unless_short_and_escaped(error.what());
    return 0;
  }
  if (text.find('\0') != std::string::npos) __builtin_trap();
  graph.validate("fuzz");
  const std::string again = remat::graph_to_json(graph);
  if (remat::graph_to_json(remat::parse_graph(again, "round trip")) != again) __builtin_trap();
  // Split finely (at most 64 stages: the search for the boundaries to remove runs too) and the
  // chain of the split, which must validate.
  const remat::GraphPartition split = remat::partition_graph(graph, remat::PartitionOptions(64));
  if (split.stages() < 1 || split.stages() > 64) __builtin_trap();
  remat::graph_chain(graph, split).validate("fuzz chain");
  return 0;
}
