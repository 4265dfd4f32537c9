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

#include "merged_chain.h"
#include "remat/base/check.h"
#include "unit_chain.h"

namespace remat {
namespace detail {
namespace {

// Whether x_k has a member carried over stage k-1.
bool has_carried(const Chain& chain, int k) {
  for (const Member& member : chain.members(k))
    if (member.carried()) return true;
  return false;
}

// A run of stages first .. end-1, its storages numbered: the members of x_first 0 .. inputs-1,
// then every new member of x_{first+1} .. x_end in order.
struct Run {
  int first = 0, end = 0;
  int inputs = 0;
  // storage[id]: the member that made each storage (its size, gradient and gradient's size).
  std::vector<Member> storage;
  // ids[k - first]: the storage of each member of x_k.
  std::vector<std::vector<int>> ids;
  // saved[k - first]: the storages stage k's autograd state holds.
  std::vector<std::vector<int>> saved;
  // The storages of x_end.
  std::set<int> output_ids;

  bool is_input(int id) const { return id < inputs; }
};

Run number_storages(const Chain& chain, int first, int end) {
  Run run;
  run.first = first;
  run.end = end;
  run.inputs = static_cast<int>(chain.members(first).size());
  Chain::Storages storages = chain.storages(first, end);
  run.storage = std::move(storages.makers);
  run.ids = std::move(storages.ids);
  run.saved.resize(static_cast<std::size_t>(end - first));
  for (int k = first; k < end; ++k) {
    const Stage& stage = chain.stages[static_cast<std::size_t>(k)];
    const auto local = static_cast<std::size_t>(k - first);
    for (const int s : stage.saved_inputs)
      run.saved[local].push_back(run.ids[local][static_cast<std::size_t>(s)]);
    for (const int s : stage.saved_outputs)
      run.saved[local].push_back(run.ids[local + 1][static_cast<std::size_t>(s)]);
  }
  run.output_ids = std::set<int>(run.ids.back().begin(), run.ids.back().end());
  return run;
}

// The merged stage's output x_end (a member of x_first carried all the way, else a new
// tensor) and what its autograd state keeps: members of x_first (saved_inputs), new members
// of x_end (saved_outputs), and intermediate storages, which join state_bytes. The bytes of
// x_end's new members.
std::int64_t merge_outputs(const Chain& chain, const Run& run, Stage& out) {
  const std::vector<int>& last = run.ids.back();
  const std::vector<Member>& end_members = chain.members(run.end);
  std::int64_t new_output_bytes = 0;
  for (std::size_t m = 0; m < last.size(); ++m) {
    const int id = last[m];
    Member member = run.storage[static_cast<std::size_t>(id)];
    member.carried_from = run.is_input(id) ? id : -1;
    member.loss_gradient = end_members[m].loss_gradient;  // false only where end is L
    if (!run.is_input(id)) new_output_bytes += member.bytes;
    out.outputs.push_back(member);
  }
  std::set<int> kept;
  for (const auto& ids_saved : run.saved) kept.insert(ids_saved.begin(), ids_saved.end());
  std::set<int> kept_outputs;
  for (const int id : kept) {
    if (run.is_input(id))
      out.saved_inputs.push_back(id);
    else if (run.output_ids.count(id) != 0)
      kept_outputs.insert(id);
    else
      out.state_bytes += run.storage[static_cast<std::size_t>(id)].bytes;
  }
  for (std::size_t m = 0; m < last.size(); ++m)
    if (kept_outputs.count(last[m]) != 0) out.saved_outputs.push_back(static_cast<int>(m));
  return new_output_bytes;
}

// The most the run's own storages take during any operation, by kind. x_first's storages are
// the merged stage's input, held by its forwards, and kept by its backward as long as any of
// the run keeps them; in the backward, x_end's new storages are kept as long (saved outputs)
// and y_end's too. Linear in the run's members (a run can be a whole chain of 10,000 stages,
// where a mask is carried through every stage): flags and counts by storage, not sets per
// stage.
struct RunPeaks {
  std::int64_t fwd = 0, nograd = 0, bwd = 0;
  std::int64_t input_gradients = 0;  // y_first's new members, in the merged stage
};

// The forwards' peaks: each stage's states, what the autograd states so far hold, its values
// x_k (read) and x_{k+1} (made; a carried storage once) and its temporary.
void forward_peaks(const Chain& chain, const Run& run, RunPeaks& peaks) {
  const std::vector<Member>& storage = run.storage;
  const std::size_t storages = storage.size();
  std::int64_t& fwd_peak = peaks.fwd;
  std::int64_t& nograd_peak = peaks.nograd;
  std::int64_t states = 0, held_bytes = 0;
  std::vector<char> held(storages, 0);
  std::vector<int> seen(storages, -1);  // the forward that last counted the storage as a value
  for (int k = run.first; k < run.end; ++k) {
    const Stage& stage = chain.stages[static_cast<std::size_t>(k)];
    const auto local = static_cast<std::size_t>(k - run.first);
    states += stage.state_bytes;
    for (const int id : run.saved[local]) {
      const auto u = static_cast<std::size_t>(id);
      if (run.is_input(id) || held[u]) continue;
      held[u] = 1;
      held_bytes += storage[u].bytes;
    }
    std::int64_t values = 0, unheld_values = 0;
    for (const std::size_t a : {local, local + 1})
      for (const int id : run.ids[a]) {
        const auto u = static_cast<std::size_t>(id);
        if (run.is_input(id) || seen[u] == k) continue;
        seen[u] = k;
        values += storage[u].bytes;
        if (!held[u]) unheld_values += storage[u].bytes;
      }
    fwd_peak = std::max(fwd_peak, states + held_bytes + unheld_values + stage.fwd_tmp_bytes);
    nograd_peak = std::max(nograd_peak, values + stage.nograd_tmp_bytes());
  }
}

// Backward: B_{end-1} .. B_first. The gradient of a storage (not one of y_end's) is made by
// the backward of the last activation it is in, and freed after the backward of the stage
// before the first (a member of x_first's stays: it is y_first's): live during the backwards
// of stages max(first, first_in - 1) .. min(last_in, end - 1), summed by a difference array.
void backward_peak(const Chain& chain, const Run& run, RunPeaks& peaks) {
  const std::vector<Member>& storage = run.storage;
  const std::size_t storages = storage.size();
  const int first = run.first, end = run.end;
  std::vector<int> first_in(storages, -1), last_in(storages, -1);
  for (int k = first; k <= end; ++k)
    for (const int id : run.ids[static_cast<std::size_t>(k - first)]) {
      if (first_in[static_cast<std::size_t>(id)] < 0) first_in[static_cast<std::size_t>(id)] = k;
      last_in[static_cast<std::size_t>(id)] = k;
    }
  const auto span = static_cast<std::size_t>(end - first);
  // x_end's storages whose gradient y_end holds (passed in from the stage after); a member of
  // x_L the loss does not differentiate has none there, and its gradient, where the run makes
  // one, is the run's own like an intermediate storage's.
  std::set<int> passed_in;
  const std::vector<Member>& end_members = chain.members(end);
  for (std::size_t m = 0; m < end_members.size(); ++m)
    if (end_members[m].loss_gradient) passed_in.insert(run.ids.back()[m]);
  std::vector<std::int64_t> gradient_change(span + 1, 0);  // by k - first
  for (std::size_t u = 0; u < storages; ++u) {
    const int id = static_cast<int>(u);
    if (!storage[u].grad || passed_in.count(id) != 0) continue;
    const std::int64_t size = storage[u].gradient_size();
    if (run.is_input(id)) peaks.input_gradients += size;
    const int lo = run.is_input(id) ? first : std::max(first, first_in[u] - 1);
    const int hi = std::min(last_in[u], end - 1);
    if (lo > hi) continue;
    gradient_change[static_cast<std::size_t>(lo - first)] += size;
    gradient_change[static_cast<std::size_t>(hi - first) + 1] -= size;
  }
  std::vector<std::int64_t> gradients(span, 0);
  std::int64_t running = 0;
  for (std::size_t k = 0; k < span; ++k) gradients[k] = running += gradient_change[k];
  // What the autograd states of stages first .. k keep, run's own storages: counts by storage,
  // all stages' at first, each backward releasing its stage's.
  std::int64_t states = 0;
  for (int k = first; k < end; ++k) states += chain.stages[static_cast<std::size_t>(k)].state_bytes;
  std::vector<int> keepers(storages, 0);
  std::int64_t kept_bytes = 0;
  for (const auto& ids_saved : run.saved)
    for (const int id : ids_saved) {
      const auto u = static_cast<std::size_t>(id);
      if (run.is_input(id) || run.output_ids.count(id) != 0) continue;
      if (keepers[u]++ == 0) kept_bytes += storage[u].bytes;
    }
  for (int k = end - 1; k >= first; --k) {
    const Stage& stage = chain.stages[static_cast<std::size_t>(k)];
    const auto local = static_cast<std::size_t>(k - first);
    peaks.bwd = std::max(peaks.bwd, states + kept_bytes + gradients[local] + stage.bwd_tmp_bytes);
    states -= stage.state_bytes;
    for (const int id : run.saved[local]) {
      const auto u = static_cast<std::size_t>(id);
      if (run.is_input(id) || run.output_ids.count(id) != 0) continue;
      if (--keepers[u] == 0) kept_bytes -= storage[u].bytes;
    }
  }
}

// Stages first .. end-1 of `chain` as one stage: its times and state the sums of theirs, its
// temporaries the peaks of the run's own storages less what the merged operation counts.
Stage merge_run(const Chain& chain, int first, int end) {
  const Run run = number_storages(chain, first, end);
  Stage out;
  out.fwd_nograd_ms = 0.0;
  for (int k = first; k < end; ++k) {
    const Stage& stage = chain.stages[static_cast<std::size_t>(k)];
    out.name += (k == first ? "" : "+") + stage.name;
    out.fwd_ms += stage.fwd_ms;
    out.bwd_ms += stage.bwd_ms;
    *out.fwd_nograd_ms += stage.nograd_ms();
    out.state_bytes += stage.state_bytes;
  }
  const std::int64_t new_output_bytes = merge_outputs(chain, run, out);
  RunPeaks peaks;
  forward_peaks(chain, run, peaks);
  backward_peak(chain, run, peaks);
  out.fwd_tmp_bytes = std::max<std::int64_t>(0, peaks.fwd - new_output_bytes - out.state_bytes);
  out.fwd_nograd_tmp_bytes = std::max<std::int64_t>(0, peaks.nograd - new_output_bytes);
  out.bwd_tmp_bytes =
      std::max<std::int64_t>(0, peaks.bwd - out.state_bytes - peaks.input_gradients);
  return out;
}

}  // namespace

std::optional<Chain> pin_input_members(const Chain& chain) {
  const int length = chain.length();
  // pinned[k][m]: member m of x_k is a member of x_0 without a gradient that stage 0 carries on.
  std::vector<std::vector<char>> pinned(static_cast<std::size_t>(length) + 1);
  pinned[0].assign(chain.inputs.size(), 0);
  for (const Member& member : chain.stages[0].outputs)
    if (member.carried() && !member.grad)
      pinned[0][static_cast<std::size_t>(member.carried_from)] = 1;
  bool carried = false;
  for (int i = 0; i < length; ++i) {
    const auto ui = static_cast<std::size_t>(i);
    for (const Member& member : chain.stages[ui].outputs) {
      const bool pin =
          member.carried() && pinned[ui][static_cast<std::size_t>(member.carried_from)] != 0;
      pinned[ui + 1].push_back(pin ? 1 : 0);
      carried = carried || pin;
    }
  }
  // Every activation keeps a member (an input, a stage's output).
  if (!carried) return std::nullopt;
  for (const auto& flags : pinned)
    if (std::count(flags.begin(), flags.end(), 1) == static_cast<std::ptrdiff_t>(flags.size()))
      return std::nullopt;
  // index[k][m]: member m of x_k's index once the pinned ones are gone (-1: pinned).
  std::vector<std::vector<int>> index(pinned.size());
  for (std::size_t k = 0; k < pinned.size(); ++k) {
    int next = 0;
    for (const char pin : pinned[k]) index[k].push_back(pin ? -1 : next++);
  }
  Chain out = chain;
  out.inputs.clear();
  for (std::size_t m = 0; m < chain.inputs.size(); ++m) {
    if (index[0][m] >= 0)
      out.inputs.push_back(chain.inputs[m]);
    else
      out.context_bytes += chain.inputs[m].bytes;
  }
  for (int i = 0; i < length; ++i) {
    const auto ui = static_cast<std::size_t>(i);
    const Stage& stage = chain.stages[ui];
    Stage& moved = out.stages[ui];
    moved.outputs.clear();
    moved.saved_inputs.clear();
    moved.saved_outputs.clear();
    for (std::size_t o = 0; o < stage.outputs.size(); ++o) {
      if (index[ui + 1][o] < 0) continue;
      Member member = stage.outputs[o];
      if (member.carried())
        member.carried_from = index[ui][static_cast<std::size_t>(member.carried_from)];
      moved.outputs.push_back(member);
    }
    for (const int s : stage.saved_inputs)
      if (index[ui][static_cast<std::size_t>(s)] >= 0)
        moved.saved_inputs.push_back(index[ui][static_cast<std::size_t>(s)]);
    for (const int s : stage.saved_outputs)
      moved.saved_outputs.push_back(index[ui + 1][static_cast<std::size_t>(s)]);
  }
  return out;
}

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
  // The merged chain's activation c is the chain's x_{first[c]}: offloading it copies the same
  // members over the same link.
  out.chain.link = chain.link;
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
      case OpKind::kOffload:
      case OpKind::kEvict:
      case OpKind::kPrefetch:
        out.push_back(Op{op.kind, begin});  // x_c of the merged chain is x_begin
        break;
    }
  }
  return out;
}

}  // namespace detail
}  // namespace remat
