// The `remat-graph/1` file format (docs/algorithms.md, "Splitting a graph into a chain"):
//   {"format": "remat-graph/1", "name": "...", "nodes": [
//     {"name": "x", "input": true, "bytes": 602112, "grad": false},
//     {"name": "conv1", "bytes": 3211264, "fwd_ms": 1.2, "bwd_ms": 2.4, "reads": [0]},
//     {"name": "relu_", "view_of": 1, "writes": [1], "reads": [1], "output": true}]}
// Absent fields take GraphNode's defaults.

#include "json_fields.h"
#include "remat/base/check.h"
#include "remat/solver/partition.h"

namespace remat {
namespace {

using detail::str_cat;
using namespace detail::json_fields;

bool get_bool(const json& value, const std::string& source, const std::string& where) {
  if (!value.is_boolean()) fail(source, where, str_cat("must be true or false, got ", type_name(value)));
  return value.get<bool>();
}

// Node indices: whole numbers below `limit` (the node's own index: only earlier nodes).
std::vector<int> get_nodes(const json& value, const std::string& source, const std::string& where,
                           std::size_t limit) {
  if (!value.is_array())
    fail(source, where, str_cat("must be an array of node indices, got ", type_name(value)));
  std::vector<int> out;
  for (std::size_t k = 0; k < value.size(); ++k) {
    const json& item = value[k];
    if (!item.is_number_integer() || item.get<std::int64_t>() < 0 ||
        item.get<std::int64_t>() >= static_cast<std::int64_t>(limit))
      fail(source, str_cat(where, "[", k, "]"),
           str_cat("must be the index of an earlier node (0 to ", limit == 0 ? 0 : limit - 1,
                   "), got ", item.dump().substr(0, 40)));
    out.push_back(static_cast<int>(item.get<std::int64_t>()));
  }
  return out;
}

GraphNode get_node(const json& item, const std::string& source, std::size_t index) {
  const std::string where = str_cat("nodes[", index, "]");
  if (!item.is_object()) fail(source, where, str_cat("must be an object, got ", type_name(item)));
  check_keys(item, source, where, {"name"},
             {"input", "tensor", "bytes", "view_of", "grad", "fwd_ms", "bwd_ms", "reads", "writes",
              "stays_with", "output"},
             "a graph node");
  GraphNode node;
  node.name = get_string(item["name"], source, where + ".name");
  if (item.contains("input")) node.input = get_bool(item["input"], source, where + ".input");
  if (item.contains("tensor")) node.tensor = get_bool(item["tensor"], source, where + ".tensor");
  if (item.contains("bytes")) node.bytes = get_bytes(item["bytes"], source, where + ".bytes");
  if (item.contains("grad")) node.grad = get_bool(item["grad"], source, where + ".grad");
  if (item.contains("fwd_ms")) node.fwd_ms = get_ms(item["fwd_ms"], source, where + ".fwd_ms");
  if (item.contains("bwd_ms")) node.bwd_ms = get_ms(item["bwd_ms"], source, where + ".bwd_ms");
  if (item.contains("view_of")) {
    const std::vector<int> base = get_nodes(json::array({item["view_of"]}), source,
                                            where + ".view_of", index);
    node.view_of = base[0];
  }
  if (item.contains("reads")) node.reads = get_nodes(item["reads"], source, where + ".reads", index);
  if (item.contains("writes"))
    node.writes = get_nodes(item["writes"], source, where + ".writes", index);
  if (item.contains("stays_with"))
    node.stays_with = get_nodes(item["stays_with"], source, where + ".stays_with", index);
  if (item.contains("output")) node.output = get_bool(item["output"], source, where + ".output");
  return node;
}

}  // namespace

Graph parse_graph(const std::string& json_text, const std::string& source) {
  json doc = parse_document(json_text, source);
  if (!doc.is_object())
    fail(source, "", str_cat("is not a remat graph: expected a JSON object, got ", type_name(doc)));
  check_keys(doc, source, "", {"format", "nodes"}, {"name"}, "a graph");
  const std::string format = get_string(doc["format"], source, "format");
  if (format != kGraphFormat)
    fail(source, "format",
         str_cat("is \"", format.substr(0, 40), "\"; this version of remat reads \"", kGraphFormat,
                 "\""));
  Graph graph;
  if (doc.contains("name")) graph.name = get_string(doc["name"], source, "name");
  const json& nodes = doc["nodes"];
  if (!nodes.is_array())
    fail(source, "nodes", str_cat("must be an array of nodes, got ", type_name(nodes)));
  if (nodes.size() > static_cast<std::size_t>(kMaxGraphNodes))
    fail(source, "nodes", str_cat("has ", nodes.size(), " entries, more than remat's limit of ",
                                  kMaxGraphNodes));
  for (std::size_t k = 0; k < nodes.size(); ++k) graph.nodes.push_back(get_node(nodes[k], source, k));
  graph.validate(source);
  return graph;
}

Graph load_graph(const std::string& path) {
  return parse_graph(detail::json_fields::read_file(path, "graph"), path);
}

std::string graph_to_json(const Graph& graph) {
  json nodes = json::array();
  for (const GraphNode& node : graph.nodes) {
    json item = json::object();
    item["name"] = node.name;
    if (node.input) item["input"] = true;
    if (!node.tensor) item["tensor"] = false;
    if (node.view_of >= 0) {
      item["view_of"] = node.view_of;
    } else {
      item["bytes"] = node.bytes;
    }
    if (!node.grad) item["grad"] = false;
    if (node.fwd_ms > 0) item["fwd_ms"] = node.fwd_ms;
    if (node.bwd_ms > 0) item["bwd_ms"] = node.bwd_ms;
    if (!node.reads.empty()) item["reads"] = node.reads;
    if (!node.writes.empty()) item["writes"] = node.writes;
    if (!node.stays_with.empty()) item["stays_with"] = node.stays_with;
    if (node.output) item["output"] = true;
    nodes.push_back(std::move(item));
  }
  json doc = json::object();
  doc["format"] = kGraphFormat;
  doc["name"] = graph.name;
  doc["nodes"] = std::move(nodes);
  return doc.dump(1) + "\n";
}

}  // namespace remat
