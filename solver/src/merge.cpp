// The merged chain of SolveOptions::merge_carried_runs: every run of stages whose activations
// carry a member becomes one stage, so that no activation of the merged chain but perhaps its
// output carries one and the dynamic program counts every storage once. docs/algorithms.md,
// "Carried members", says why; the merged stage's fields are derived below so that, once
// expanded, its sequences run on the chain itself in no more memory than the merged chain
// predicts and in the same time.
#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "detail.h"
#include "remat/solver/check.h"

namespace remat {
namespace detail {
namespace {

// Whether x_k has a member carried over stage k-1.
bool has_carried(const Chain& chain, int k) {
  for (const Member& member : chain.members(k))
    if (member.carried()) return true;
  return false;
}

// Stages first .. end-1 of `chain` as one stage. Storages are numbered: the members of x_first
// 0 .. n-1 ("inputs"), then every new member of x_{first+1} .. x_end in order.
Stage merge_run(const Chain& chain, int first, int end) {
  const int inputs = static_cast<int>(chain.members(first).size());
  std::vector<std::int64_t> bytes;
  std::vector<bool> grad;
  for (const Member& member : chain.members(first)) {
    bytes.push_back(member.bytes);
    grad.push_back(member.grad);
  }
  // ids[k - first]: the storage of each member of x_k.
  std::vector<std::vector<int>> ids(static_cast<std::size_t>(end - first) + 1);
  for (int m = 0; m < inputs; ++m) ids[0].push_back(m);
  // saved[k - first]: the storages stage k's autograd state holds.
  std::vector<std::vector<int>> saved(static_cast<std::size_t>(end - first));
  Stage out;
  out.fwd_nograd_ms = 0.0;
  for (int k = first; k < end; ++k) {
    const Stage& stage = chain.stages[static_cast<std::size_t>(k)];
    const auto local = static_cast<std::size_t>(k - first);
    out.name += (k == first ? "" : "+") + stage.name;
    out.fwd_ms += stage.fwd_ms;
    out.bwd_ms += stage.bwd_ms;
    *out.fwd_nograd_ms += stage.nograd_ms();
    out.state_bytes += stage.state_bytes;
    std::vector<int>& next = ids[local + 1];
    for (const Member& member : stage.outputs) {
      if (member.carried()) {
        next.push_back(ids[local][static_cast<std::size_t>(member.carried_from)]);
      } else {
        next.push_back(static_cast<int>(bytes.size()));
        bytes.push_back(member.bytes);
        grad.push_back(member.grad);
      }
    }
    for (const int s : stage.saved_inputs)
      saved[local].push_back(ids[local][static_cast<std::size_t>(s)]);
    for (const int s : stage.saved_outputs)
      saved[local].push_back(next[static_cast<std::size_t>(s)]);
  }
  const auto is_input = [&](int id) { return id < inputs; };
  const auto sum = [&](const std::set<int>& set) {
    std::int64_t total = 0;
    for (const int id : set) total += bytes[static_cast<std::size_t>(id)];
    return total;
  };
  const std::vector<int>& last = ids.back();
  const std::set<int> output_ids(last.begin(), last.end());

  // The output x_end: a member of x_first carried all the way, else a new tensor.
  std::int64_t new_output_bytes = 0;
  for (const int id : last) {
    Member member{bytes[static_cast<std::size_t>(id)], grad[static_cast<std::size_t>(id)]};
    if (is_input(id))
      member.carried_from = id;
    else
      new_output_bytes += member.bytes;
    out.outputs.push_back(member);
  }
  // What the run's autograd states keep: members of x_first (saved_inputs), new members of
  // x_end (saved_outputs), and intermediate storages, which join state_bytes.
  std::set<int> kept;
  for (const auto& ids_saved : saved) kept.insert(ids_saved.begin(), ids_saved.end());
  std::set<int> kept_outputs;
  for (const int id : kept) {
    if (is_input(id))
      out.saved_inputs.push_back(id);
    else if (output_ids.count(id) != 0)
      kept_outputs.insert(id);
    else
      out.state_bytes += bytes[static_cast<std::size_t>(id)];
  }
  for (std::size_t m = 0; m < last.size(); ++m)
    if (kept_outputs.count(last[m]) != 0) out.saved_outputs.push_back(static_cast<int>(m));

  // Temporaries: the most the run's own storages take during any of its operations, less what
  // the merged operation already counts. x_first's storages are the merged stage's input, held
  // by its forwards, and kept by its backward as long as any of the run keeps them; in the
  // backward, x_end's new storages are kept as long (saved outputs) and y_end's too.
  std::int64_t fwd_peak = 0, nograd_peak = 0, bwd_peak = 0;
  std::int64_t states = 0;
  std::set<int> held;
  for (int k = first; k < end; ++k) {
    const Stage& stage = chain.stages[static_cast<std::size_t>(k)];
    const auto local = static_cast<std::size_t>(k - first);
    states += stage.state_bytes;
    for (const int id : saved[local])
      if (!is_input(id)) held.insert(id);
    std::set<int> values;  // x_k, read, and x_{k+1}, made
    for (const std::size_t a : {local, local + 1})
      for (const int id : ids[a])
        if (!is_input(id)) values.insert(id);
    std::set<int> during = held;
    during.insert(values.begin(), values.end());
    fwd_peak = std::max(fwd_peak, states + sum(during) + stage.fwd_tmp_bytes);
    nograd_peak = std::max(nograd_peak, sum(values) + stage.nograd_tmp_bytes());
  }
  // Backward: B_{end-1} .. B_first. The gradient of a storage (not one of y_end's) is made by
  // the backward of the last activation it is in, and freed after the backward of the stage
  // before the first (a member of x_first's stays: it is y_first's).
  std::vector<int> first_in(bytes.size(), -1), last_in(bytes.size(), -1);
  for (int k = first; k <= end; ++k)
    for (const int id : ids[static_cast<std::size_t>(k - first)]) {
      if (first_in[static_cast<std::size_t>(id)] < 0) first_in[static_cast<std::size_t>(id)] = k;
      last_in[static_cast<std::size_t>(id)] = k;
    }
  std::int64_t input_gradients = 0;  // y_first's new members, in the merged stage
  for (int id = 0; id < inputs; ++id)
    if (grad[static_cast<std::size_t>(id)] && output_ids.count(id) == 0)
      input_gradients += bytes[static_cast<std::size_t>(id)];
  for (int k = end - 1; k >= first; --k) {
    const Stage& stage = chain.stages[static_cast<std::size_t>(k)];
    std::int64_t live = stage.bwd_tmp_bytes;
    std::set<int> kept_now;  // stages first .. k still hold their autograd states
    for (int s = first; s <= k; ++s) {
      live += chain.stages[static_cast<std::size_t>(s)].state_bytes;
      for (const int id : saved[static_cast<std::size_t>(s - first)])
        if (!is_input(id) && output_ids.count(id) == 0) kept_now.insert(id);
    }
    live += sum(kept_now);
    for (std::size_t id = 0; id < bytes.size(); ++id) {
      if (!grad[id] || output_ids.count(static_cast<int>(id)) != 0 || last_in[id] < 0) continue;
      const int made = last_in[id];
      const int freed_after = is_input(static_cast<int>(id)) ? first - 1 : first_in[id] - 1;
      if (k <= made && k >= freed_after) live += bytes[id];
    }
    bwd_peak = std::max(bwd_peak, live);
  }
  out.fwd_tmp_bytes = std::max<std::int64_t>(0, fwd_peak - new_output_bytes - out.state_bytes);
  out.fwd_nograd_tmp_bytes = std::max<std::int64_t>(0, nograd_peak - new_output_bytes);
  out.bwd_tmp_bytes = std::max<std::int64_t>(0, bwd_peak - out.state_bytes - input_gradients);
  return out;
}

}  // namespace

std::optional<MergedChain> merge_carried_runs(const Chain& chain) {
  const int length = chain.length();
  MergedChain out;
  out.first.push_back(0);
  for (int k = 1; k < length; ++k)
    if (!has_carried(chain, k)) out.first.push_back(k);
  out.first.push_back(length);
  if (static_cast<int>(out.first.size()) - 1 == length) return std::nullopt;
  out.chain.name = chain.name;
  out.chain.inputs = chain.inputs;
  out.chain.context_bytes = chain.context_bytes;
  out.chain.loss_tmp_bytes = chain.loss_tmp_bytes;
  out.chain.output_held = chain.output_held;
  out.chain.restart_ms = chain.restart_ms;
  for (std::size_t c = 0; c + 1 < out.first.size(); ++c) {
    const int first = out.first[c], end = out.first[c + 1];
    out.chain.stages.push_back(end - first == 1 ? chain.stages[static_cast<std::size_t>(first)]
                                                : merge_run(chain, first, end));
  }
  // Sums of times or sizes past the chain limits: no merged chain.
  try {
    out.chain.validate(chain_source(chain) + " (runs of carried members merged)");
  } catch (const ChainError&) {
    return std::nullopt;
  }
  return out;
}

Sequence expand_merged(const Sequence& merged, const std::vector<int>& first) {
  Sequence out;
  for (const Op& op : merged) {
    const auto c = static_cast<std::size_t>(op.stage);
    if (op.kind == OpKind::kLoss) {
      out.push_back(loss(first.back()));
      continue;
    }
    const int begin = first[c], end = first[c + 1];
    switch (op.kind) {
      case OpKind::kForwardGrad:
        for (int k = begin; k < end; ++k) out.push_back(fe(k));
        break;
      case OpKind::kForwardCheckpoint:
        out.push_back(cf(begin));
        for (int k = begin + 1; k < end; ++k) out.push_back(fn(k));
        break;
      case OpKind::kForwardNoGrad:
        for (int k = begin; k < end; ++k) out.push_back(fn(k));
        break;
      case OpKind::kBackward:
        for (int k = end - 1; k >= begin; --k) out.push_back(bwd(k));
        break;
      case OpKind::kLoss:
        break;
    }
  }
  return out;
}

}  // namespace detail
}  // namespace remat
