// Splitting a forward graph into a chain (docs/algorithms.md, "Splitting a graph into a
// chain"). The graph is in a topological order, the order its program ran; a stage is a run of
// consecutive nodes, so a split is a set of boundaries between nodes. What crosses boundary p
// is every storage that a node at or before p made and that a node after p reads (or the
// graph returns): the tensors of x_k, each storage once.
#include "remat/solver/partition.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "remat/base/check.h"
#include "remat/base/text.h"

namespace remat {
namespace {

using detail::str_cat;

[[noreturn]] void fail(const std::string& source, std::size_t node, const std::string& what) {
  // `what` can quote the file (a node's name): shortened and printable.
  throw ChainError(str_cat(source, ": nodes[", node, "]", shortened(what, 600)));
}

// The node that owns each node's storage (itself, or the root of its views).
std::vector<int> storage_roots(const Graph& graph) {
  std::vector<int> root(graph.nodes.size());
  for (std::size_t v = 0; v < graph.nodes.size(); ++v) {
    const int base = graph.nodes[v].view_of;
    root[v] = base < 0 ? static_cast<int>(v) : root[static_cast<std::size_t>(base)];
  }
  return root;
}

// One past the last position where each node's value is needed: its last reader, or the
// node count where the graph returns it.
std::vector<int> value_ends(const Graph& graph) {
  const int n = static_cast<int>(graph.nodes.size());
  std::vector<int> end(graph.nodes.size());
  for (int v = 0; v < n; ++v) end[static_cast<std::size_t>(v)] = v + 1;
  for (int v = 0; v < n; ++v) {
    const GraphNode& node = graph.nodes[static_cast<std::size_t>(v)];
    for (const int r : node.reads)
      end[static_cast<std::size_t>(r)] = std::max(end[static_cast<std::size_t>(r)], v + 1);
    if (node.output) end[static_cast<std::size_t>(v)] = n + 1;
  }
  return end;
}

// One past the last position where each storage is needed: the latest end of its views.
std::vector<int> storage_ends(const Graph& graph, const std::vector<int>& root,
                              const std::vector<int>& end) {
  std::vector<int> storage_end(graph.nodes.size(), 0);
  for (std::size_t v = 0; v < graph.nodes.size(); ++v) {
    const auto r = static_cast<std::size_t>(root[v]);
    storage_end[r] = std::max(storage_end[r], end[v]);
  }
  return storage_end;
}

// The members of x_k for boundary position p (after node p): the tensor values made at or
// before p and needed after it, in node order.
std::vector<int> crossing_values(const Graph& graph, const std::vector<int>& end, int p) {
  std::vector<int> values;
  for (int v = 0; v <= p; ++v)
    if (graph.nodes[static_cast<std::size_t>(v)].tensor && end[static_cast<std::size_t>(v)] > p + 1)
      values.push_back(v);
  return values;
}

// The boundaries of a split, each between two stages, that can still be removed: a doubly
// linked list over the stages, the boundaries ordered by the score that orders removals.
class BoundaryList {
 public:
  BoundaryList(std::vector<int> positions, const std::vector<double>& node_ms,
               const std::vector<double>& node_bytes, const std::vector<std::int64_t>& crossing,
               int first_node, int node_count)
      : positions_(std::move(positions)), crossing_(crossing) {
    // Stage s runs from the node after boundary s-1 to boundary s's node; stages s and s+1
    // are separated by boundary s.
    const std::size_t count = positions_.size();
    const auto sums = [&](const std::vector<double>& per_node) {
      std::vector<double> prefix(per_node.size() + 1, 0);
      for (std::size_t v = 0; v < per_node.size(); ++v) prefix[v + 1] = prefix[v] + per_node[v];
      std::vector<double> out(count + 1);
      int begin = first_node;
      for (std::size_t s = 0; s <= count; ++s) {
        const int stop = s < count ? positions_[s] + 1 : node_count;
        out[s] = prefix[static_cast<std::size_t>(stop)] - prefix[static_cast<std::size_t>(begin)];
        begin = stop;
      }
      return std::pair(out, std::max(prefix.back(), 1e-12));
    };
    std::tie(stage_ms_, total_ms_) = sums(node_ms);
    std::tie(stage_bytes_, total_bytes_) = sums(node_bytes);
    double crossing_sum = 0;
    for (const int p : positions_) crossing_sum += width(p);
    mean_width_ = std::max(1.0, crossing_sum / static_cast<double>(std::max<std::size_t>(1, count)));
    first_width_ = width(first_node - 1);
    last_width_ = width(node_count - 1);
    left_.resize(count + 1);
    right_.resize(count + 1);
    for (std::size_t s = 0; s <= count; ++s) {
      left_[s] = static_cast<int>(s) - 1;
      right_[s] = s < count ? static_cast<int>(s) + 1 : -1;
      footprints_.insert(footprint(s));
    }
    alive_.assign(count, true);
    keys_.resize(count);
    for (std::size_t b = 0; b < count; ++b) enqueue(b);
  }

  // Removes the boundary least worth keeping, merging the stages on either side: the lowest
  // score among those whose merged stage needs no more memory than the largest stage now,
  // else the one whose merged stage needs the least. (The scan is linear at worst, where most
  // merges would grow the largest stage; the splits remat makes remove a few hundred.)
  void remove_one() {
    const double largest = *footprints_.rbegin();
    std::size_t b = by_memory_.begin()->second;
    for (const auto& [score, candidate] : by_score_)
      if (keys_[candidate].second <= largest) {
        b = candidate;
        break;
      }
    dequeue(b);
    alive_[b] = false;
    // Stage b+1 (the right one) joins the stage on b's left, the one whose right neighbour it
    // is (a stage is named by its first boundary's index + 1).
    const std::size_t right = b + 1;
    const auto left = static_cast<std::size_t>(left_[right]);
    footprints_.erase(footprints_.find(footprint(left)));
    footprints_.erase(footprints_.find(footprint(right)));
    stage_ms_[left] += stage_ms_[right];
    stage_bytes_[left] += stage_bytes_[right];
    right_[left] = right_[right];
    if (right_[right] >= 0) left_[static_cast<std::size_t>(right_[right])] = static_cast<int>(left);
    footprints_.insert(footprint(left));
    // The boundaries on either side of the merged stage change.
    const int after = right_[left];
    for (const int boundary : {static_cast<int>(left) - 1, after >= 0 ? after - 1 : -1}) {
      if (boundary < 0 || !alive_[static_cast<std::size_t>(boundary)]) continue;
      dequeue(static_cast<std::size_t>(boundary));
      enqueue(static_cast<std::size_t>(boundary));
    }
  }

  std::vector<int> remaining() const {
    std::vector<int> out;
    for (std::size_t b = 0; b < positions_.size(); ++b)
      if (alive_[b]) out.push_back(positions_[b]);
    return out;
  }

 private:
  double width(int position) const {
    return static_cast<double>(crossing_[static_cast<std::size_t>(position)]);
  }
  // What stage s needs at once when it runs with autograd, roughly: its input, what it makes,
  // its output.
  double footprint(std::size_t s) const {
    const double before = s > 0 ? width(positions_[s - 1]) : first_width_;
    const double after = right_[s] >= 0 ? width(positions_[static_cast<std::size_t>(right_[s] - 1)])
                                        : last_width_;
    return before + stage_bytes_[s] + after;
  }
  // Removing boundary b makes one stage of the two on either side: its recomputation costs
  // their time together, and running it with autograd needs their intermediates together.
  // Keeping b costs the bytes of x_k when it is stored. A boundary is worth keeping by the
  // share of the time and of the memory it separates, per byte it would store (each against
  // the graph's total, and the mean width): cheap, small, wide boundaries go first, and the
  // stages grow evenly in time and memory where the widths are alike. Returns the score and
  // the merged stage's footprint.
  std::pair<double, double> key(std::size_t b) const {
    const auto right = b + 1;
    const auto left = static_cast<std::size_t>(left_[right]);
    const double ms = (stage_ms_[left] + stage_ms_[right]) / total_ms_;
    const double bytes = (stage_bytes_[left] + stage_bytes_[right]) / total_bytes_;
    const double score = (ms + bytes) * mean_width_ / std::max(1.0, width(positions_[b]));
    const double before = left > 0 ? width(positions_[left - 1]) : first_width_;
    const double after = right_[right] >= 0
                             ? width(positions_[static_cast<std::size_t>(right_[right] - 1)])
                             : last_width_;
    return {score, before + stage_bytes_[left] + stage_bytes_[right] + after};
  }
  void enqueue(std::size_t b) {
    keys_[b] = key(b);
    by_score_.insert({keys_[b].first, b});
    by_memory_.insert({keys_[b].second, b});
  }
  void dequeue(std::size_t b) {
    by_score_.erase({keys_[b].first, b});
    by_memory_.erase({keys_[b].second, b});
  }

  std::vector<int> positions_;
  const std::vector<std::int64_t>& crossing_;
  std::vector<double> stage_ms_, stage_bytes_;  // each stage's time and the bytes it makes
  double total_ms_ = 0, total_bytes_ = 0, mean_width_ = 1, first_width_ = 0, last_width_ = 0;
  std::vector<int> left_, right_;  // neighbouring stages, -1 at the ends
  std::multiset<double> footprints_;  // every stage's
  std::vector<bool> alive_;
  std::vector<std::pair<double, double>> keys_;  // each boundary's, as queued
  std::set<std::pair<double, std::size_t>> by_score_, by_memory_;
};

}  // namespace

int Graph::input_count() const {
  int count = 0;
  while (count < static_cast<int>(nodes.size()) && nodes[static_cast<std::size_t>(count)].input)
    ++count;
  return count;
}

void Graph::validate(const std::string& source) const {
  if (nodes.size() > static_cast<std::size_t>(kMaxGraphNodes))
    throw ChainError(str_cat(source, ": has ", nodes.size(), " nodes, more than remat's limit of ",
                             kMaxGraphNodes));
  const int inputs = input_count();
  if (inputs == 0) throw ChainError(str_cat(source, ": has no input node (inputs come first)"));
  if (inputs == static_cast<int>(nodes.size()))
    throw ChainError(str_cat(source, ": has no operation, only inputs"));
  for (std::size_t v = 0; v < nodes.size(); ++v) {
    const GraphNode& node = nodes[v];
    if (node.input && static_cast<int>(v) >= inputs)
      fail(source, v, " is an input after an operation: inputs come first");
    if (node.bytes < 0 || node.bytes > kMaxChainBytes)
      fail(source, v, str_cat(".bytes (", node.bytes, ") must be between 0 and 2^50"));
    for (const double ms : {node.fwd_ms, node.bwd_ms})
      if (!std::isfinite(ms) || ms < 0 || ms > kMaxStageMs)
        fail(source, v, str_cat(" has a time (", ms, " ms) that is negative or too large"));
    const auto check_earlier = [&](int other, const char* field) {
      if (other < 0 || other >= static_cast<int>(v))
        fail(source, v, str_cat(".", field, " names node ", other,
                                ", which is not an earlier node (the order must be topological)"));
    };
    if (node.view_of >= 0) {
      check_earlier(node.view_of, "view_of");
      if (!node.tensor) fail(source, v, ".view_of is given for a value that is not a tensor");
    }
    for (const int r : node.reads) check_earlier(r, "reads");
    for (const int w : node.stays_with) {
      check_earlier(w, "stays_with");
      if (w < inputs)
        fail(source, v, str_cat(".stays_with names input ", nodes[static_cast<std::size_t>(w)].name,
                                ", which is in no stage"));
    }
    for (const int w : node.writes) {
      check_earlier(w, "writes");
      if (node.input) fail(source, v, " is an input and writes another node");
    }
    if (node.input && !node.reads.empty()) fail(source, v, " is an input and reads another node");
    if (node.output && !node.tensor)
      fail(source, v, " is returned by the graph but is not a tensor");
  }
  const std::vector<int> root = storage_roots(*this);
  for (std::size_t v = 0; v < nodes.size(); ++v)
    for (const int w : nodes[v].writes)
      if (root[static_cast<std::size_t>(w)] < inputs)
        fail(source, v, str_cat(" writes the storage of input ", nodes[static_cast<std::size_t>(
                                    root[static_cast<std::size_t>(w)])].name,
                                " in place: a chain's stages never modify their input"));
  bool any_output = false;
  for (const GraphNode& node : nodes) any_output = any_output || node.output;
  if (!any_output) throw ChainError(str_cat(source, ": returns nothing (no node is an output)"));
}

std::vector<bool> legal_boundaries(const Graph& graph) {
  const int n = static_cast<int>(graph.nodes.size());
  const int inputs = graph.input_count();
  std::vector<bool> legal(graph.nodes.size(), false);
  for (int p = inputs; p < n - 1; ++p) legal[static_cast<std::size_t>(p)] = true;
  // forbid(a, b): no boundary after nodes a .. b-1 (a and b in one stage).
  const auto forbid = [&](int a, int b) {
    for (int p = std::max(a, inputs); p < b; ++p) legal[static_cast<std::size_t>(p)] = false;
  };
  const std::vector<int> root = storage_roots(graph);
  const std::vector<int> end = value_ends(graph);
  for (int v = inputs; v < n; ++v) {
    const GraphNode& node = graph.nodes[static_cast<std::size_t>(v)];
    if (!node.tensor) forbid(v, end[static_cast<std::size_t>(v)] - 1);
    for (const int w : node.writes) forbid(root[static_cast<std::size_t>(w)], v);
    for (const int w : node.stays_with) forbid(w, v);
  }
  // Not where two values of one storage cross together (a tensor and a view of it read
  // further on, or two views): a stage's output that views another member is measured as a
  // storage of its own (a chain's members never share one), which would overstate that
  // boundary's bytes by the storage once more wherever it is kept. Value v crosses the
  // boundaries after nodes v .. end[v]-2; each storage's values by their first.
  // And not where nothing crosses: a node that reads no earlier value (a constant, `arange`)
  // after every earlier value's last reader leaves the boundary before it empty, and a chain's
  // x_k holds at least one tensor (found by fuzzing: the chain of such a split did not
  // validate). `crossing_count`: +1 at each value's first boundary, -1 past its last.
  std::map<int, std::vector<std::pair<int, int>>> crossings;  // storage -> [first, last]
  std::vector<int> crossing_count(graph.nodes.size() + 1, 0);
  for (int v = 0; v < n; ++v)
    if (graph.nodes[static_cast<std::size_t>(v)].tensor &&
        end[static_cast<std::size_t>(v)] - 2 >= v) {
      crossings[root[static_cast<std::size_t>(v)]].emplace_back(v, end[static_cast<std::size_t>(v)] - 2);
      ++crossing_count[static_cast<std::size_t>(v)];
      --crossing_count[static_cast<std::size_t>(end[static_cast<std::size_t>(v)] - 1)];
    }
  for (auto& [storage, spans] : crossings) {
    std::sort(spans.begin(), spans.end());
    int last = -1;  // the furthest boundary an earlier value of the storage crosses
    for (const auto& [first, until] : spans) {
      if (last >= first) forbid(first, std::min(last, until) + 1);
      last = std::max(last, until);
    }
  }
  int crossing_values = 0;
  for (int p = 0; p < n; ++p) {
    crossing_values += crossing_count[static_cast<std::size_t>(p)];
    if (crossing_values == 0) legal[static_cast<std::size_t>(p)] = false;
  }
  return legal;
}

namespace {
// crossing_bytes, of the storages with a gradient only where `gradients`.
std::vector<std::int64_t> crossing(const Graph& graph, bool gradients) {
  const std::size_t n = std::min(graph.nodes.size(), static_cast<std::size_t>(kMaxGraphNodes));
  const std::vector<int> root = storage_roots(graph);
  const std::vector<int> storage_end = storage_ends(graph, root, value_ends(graph));
  // A storage made by node s and needed until e crosses the boundaries after s .. e-2.
  std::vector<std::int64_t> delta(n + 1, 0);
  for (std::size_t s = 0; s < n; ++s) {
    if (root[s] != static_cast<int>(s) || !graph.nodes[s].tensor) continue;
    if (gradients && !graph.nodes[s].grad) continue;
    const auto stop = static_cast<std::size_t>(std::min<int>(storage_end[s] - 1, static_cast<int>(n)));
    if (stop <= s) continue;
    delta[s] += graph.nodes[s].bytes;
    delta[stop] -= graph.nodes[s].bytes;
  }
  std::vector<std::int64_t> out(n, 0);
  std::int64_t live = 0;
  for (std::size_t p = 0; p < n; ++p) out[p] = live += delta[p];
  return out;
}
}  // namespace

std::vector<std::int64_t> crossing_bytes(const Graph& graph) { return crossing(graph, false); }

GraphPartition partition_graph(const Graph& graph, const PartitionOptions& options) {
  graph.validate();
  REMAT_CHECK(options.max_stages() >= 1, "max_stages (", options.max_stages(),
              ") must be at least 1");
  const std::vector<bool> legal = legal_boundaries(graph);
  const std::vector<std::int64_t> crossing = crossing_bytes(graph);
  std::vector<int> positions;
  for (std::size_t p = 0; p < legal.size(); ++p)
    if (legal[p]) positions.push_back(static_cast<int>(p));
  GraphPartition out;
  out.legal_boundaries = static_cast<int>(positions.size());
  const int n = static_cast<int>(graph.nodes.size());
  if (static_cast<int>(positions.size()) >= options.max_stages()) {
    std::vector<double> node_ms, node_bytes;
    for (const GraphNode& node : graph.nodes) {
      node_ms.push_back(node.fwd_ms + node.bwd_ms);
      node_bytes.push_back(node.tensor && node.view_of < 0 ? static_cast<double>(node.bytes) : 0);
    }
    BoundaryList list(positions, node_ms, node_bytes, crossing, graph.input_count(), n);
    for (int k = static_cast<int>(positions.size()); k >= options.max_stages(); --k)
      list.remove_one();
    positions = list.remaining();
  }
  for (const int p : positions) {
    out.ends.push_back(p + 1);
    out.boundary_bytes.push_back(crossing[static_cast<std::size_t>(p)]);
  }
  out.ends.push_back(n);
  // What the graph returns, each storage once.
  const std::vector<int> root = storage_roots(graph);
  std::set<int> returned;
  for (std::size_t v = 0; v < graph.nodes.size(); ++v)
    if (graph.nodes[v].output) returned.insert(root[v]);
  std::int64_t returned_bytes = 0;
  for (const int r : returned) returned_bytes += graph.nodes[static_cast<std::size_t>(r)].bytes;
  out.boundary_bytes.push_back(returned_bytes);
  return out;
}

Chain graph_chain(const Graph& graph, const GraphPartition& partition) {
  graph.validate();
  const int n = static_cast<int>(graph.nodes.size());
  const int inputs = graph.input_count();
  REMAT_CHECK(!partition.ends.empty() && partition.ends.back() == n,
              "the split's last stage must end at the graph's end (node ", n, ")");
  const std::vector<bool> legal = legal_boundaries(graph);
  for (std::size_t k = 0; k + 1 < partition.ends.size(); ++k) {
    const int p = partition.ends[k] - 1;
    REMAT_CHECK(p >= inputs && p < n - 1 && legal[static_cast<std::size_t>(p)] &&
                    (k == 0 || partition.ends[k] > partition.ends[k - 1]),
                "the split's boundary after node ", p, " is not a legal boundary of the graph");
  }
  const std::vector<int> root = storage_roots(graph);
  const std::vector<int> end = value_ends(graph);
  const std::vector<std::int64_t> live_bytes = crossing(graph, false);
  const std::vector<std::int64_t> gradients = crossing(graph, true);
  Chain chain;
  chain.name = graph.name;
  // members_of(values, previous, previous_members): the members of an activation. A value of
  // the previous activation is carried from it, with its bytes. A storage is counted once: by
  // a carried member that counted it, else by its new member needed longest (so that the
  // count lasts while any of its views does).
  const auto members_of = [&](const std::vector<int>& values, const std::vector<int>* previous,
                              const std::vector<Member>* previous_members) {
    std::vector<Member> members(values.size());
    std::map<int, std::size_t> counter;  // storage -> the member that counts it
    for (std::size_t j = 0; j < values.size(); ++j) {
      const auto v = static_cast<std::size_t>(values[j]);
      members[j].grad = graph.nodes[v].grad;
      if (!previous) continue;
      const auto at = std::find(previous->begin(), previous->end(), values[j]);
      if (at == previous->end()) continue;
      members[j].carried_from = static_cast<int>(at - previous->begin());
      members[j].bytes = (*previous_members)[static_cast<std::size_t>(members[j].carried_from)].bytes;
      if (members[j].bytes > 0) counter.emplace(root[v], j);
    }
    for (std::size_t j = 0; j < values.size(); ++j) {
      if (members[j].carried()) continue;
      const auto v = static_cast<std::size_t>(values[j]);
      const auto [it, fresh] = counter.emplace(root[v], j);
      const auto holder = static_cast<std::size_t>(values[it->second]);
      if (!fresh && !members[it->second].carried() && end[v] > end[holder]) it->second = j;
    }
    for (const auto& [storage, j] : counter)
      if (!members[j].carried()) members[j].bytes = graph.nodes[static_cast<std::size_t>(storage)].bytes;
    return members;
  };
  std::vector<int> current;
  for (int v = 0; v < inputs; ++v) current.push_back(v);
  chain.inputs = members_of(current, nullptr, nullptr);
  int begin = inputs;
  for (std::size_t k = 0; k < partition.ends.size(); ++k) {
    const int stop = partition.ends[k];
    std::vector<int> next;
    if (stop == n) {
      for (int v = 0; v < n; ++v)
        if (graph.nodes[static_cast<std::size_t>(v)].output) next.push_back(v);
    } else {
      next = crossing_values(graph, end, stop - 1);
    }
    Stage stage;
    std::int64_t inner_nograd = 0;
    stage.name = str_cat(graph.nodes[static_cast<std::size_t>(begin)].name,
                         stop - begin > 1 ? str_cat("..", graph.nodes[static_cast<std::size_t>(stop - 1)].name) : "");
    stage.outputs = members_of(next, &current, k == 0 ? &chain.inputs : &chain.stages.back().outputs);
    // Inside the stage, its intermediates come and go as between the finer stages it could
    // have been: without autograd, those crossing each inner boundary are live together (the
    // forward's transient); in the backward, so are their gradients.
    for (int p = begin; p + 1 < stop; ++p) {
      stage.bwd_tmp_bytes = std::max(stage.bwd_tmp_bytes, gradients[static_cast<std::size_t>(p)]);
      inner_nograd = std::max(inner_nograd, live_bytes[static_cast<std::size_t>(p)]);
    }
    stage.fwd_nograd_tmp_bytes = inner_nograd;
    std::set<int> read;
    for (int v = begin; v < stop; ++v) {
      const GraphNode& node = graph.nodes[static_cast<std::size_t>(v)];
      stage.fwd_ms += node.fwd_ms;
      stage.bwd_ms += node.bwd_ms;
      read.insert(node.reads.begin(), node.reads.end());
      const bool leaves = std::find(next.begin(), next.end(), v) != next.end();
      if (!leaves && node.tensor && root[static_cast<std::size_t>(v)] == v) stage.state_bytes += node.bytes;
    }
    for (std::size_t j = 0; j < current.size(); ++j)
      if (read.count(current[j])) stage.saved_inputs.push_back(static_cast<int>(j));
    for (std::size_t j = 0; j < stage.outputs.size(); ++j)
      if (!stage.outputs[j].carried()) stage.saved_outputs.push_back(static_cast<int>(j));
    chain.stages.push_back(std::move(stage));
    current = std::move(next);
    begin = stop;
  }
  chain.validate(graph.name.empty() ? "the graph's chain" : graph.name);
  return chain;
}

}  // namespace remat
