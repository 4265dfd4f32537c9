// make_unit_chain: a chain in memory units (unit_chain.h).
#include "unit_chain.h"

#include "remat/base/check.h"

namespace remat {
namespace detail {

UnitChain make_unit_chain(const Chain& chain, std::int64_t unit_bytes, bool use_nograd_time,
                          bool published_chain_step, bool offload) {
  REMAT_INTERNAL_ASSERT(unit_bytes >= 1);
  const int length = chain.length();
  const auto n = static_cast<std::size_t>(length);
  // ceil(bytes / unit), without forming bytes + unit - 1 (the unit can be near int64's largest).
  auto units = [unit_bytes](std::int64_t bytes) {
    return bytes / unit_bytes + (bytes % unit_bytes != 0 ? 1 : 0);
  };
  UnitChain c;
  c.length = length;
  c.published_chain_step = published_chain_step;
  c.x.assign(n + 2, 0);
  c.g.assign(n + 2, 0);
  for (auto* array : {&c.sv, &c.gk, &c.hf, &c.ht, &c.ft, &c.nt, &c.bt}) array->assign(n + 1, 0);
  c.fw.assign(n + 1, 0.0);
  c.bw.assign(n + 1, 0.0);
  c.nf.assign(n + 1, 0.0);
  for (int k = 0; k <= length; ++k) {
    c.x[static_cast<std::size_t>(k)] = units(chain.activation_bytes(k));
    c.g[static_cast<std::size_t>(k)] = units(chain.gradient_bytes(k));
  }
  // Bytes of the members of x_k listed in `a` or `b`, each once.
  auto kept = [&](int k, const std::vector<int>* a, const std::vector<int>* b) {
    std::vector<bool> in(chain.members(k).size(), false);
    for (const auto* list : {a, b})
      if (list)
        for (const int m : *list) in[static_cast<std::size_t>(m)] = true;
    std::int64_t bytes = 0;
    for (std::size_t m = 0; m < in.size(); ++m)
      if (in[m]) bytes += chain.members(k)[m].bytes;
    return units(bytes);
  };
  for (std::size_t i = 0; i < n; ++i) {
    const Stage& stage = chain.stages[i];
    const int k = static_cast<int>(i);
    c.gk[i] = units(stage.kept_bytes());
    // A stage that keeps its whole output holds it with its state from Fe_i to B_i: round
    // the two together, as the reference rounds its xbar (gk = xb, sv = xb - x).
    c.sv[i] = stage.saved_outputs.size() == stage.outputs.size() ? c.gk[i] - c.x[i + 1]
                                                                 : units(stage.state_bytes);
    c.hf[i] = i == 0 ? c.x[0] : kept(k, &stage.saved_inputs, nullptr);
    c.ht[i] = i == 0 ? c.x[0] : kept(k, &stage.saved_inputs, &chain.stages[i - 1].saved_outputs);
    c.ft[i] = units(stage.fwd_tmp_bytes);
    c.nt[i] = units(stage.nograd_tmp_bytes());
    c.bt[i] = units(stage.bwd_tmp_bytes);
    c.fw[i] = stage.fwd_ms;
    c.bw[i] = stage.bwd_ms;
    c.nf[i] = use_nograd_time ? stage.nograd_ms() : stage.fwd_ms;
  }
  c.hf[n] = c.ht[n] = c.x[n];
  c.bt[n] = units(chain.loss_tmp_bytes);
  c.context = units(chain.context_bytes);
  c.restart = chain.restart_ms;
  if (chain.output_held && !published_chain_step) {
    c.tail = c.x[n];
    // The members of x_L that stage L-1 keeps, rounded down: with the rest of its state
    // (gk, rounded up), they are never counted below their bytes.
    const Stage& last = chain.stages[n - 1];
    c.tail_shared = (last.kept_bytes() - last.state_bytes) / unit_bytes;
  }
  if (offload && chain.link && !published_chain_step) {
    c.cd.assign(n + 1, 0.0);
    c.ch.assign(n + 1, 0.0);
    c.pinned.assign(n + 1, false);
    for (std::size_t k = 1; k < n; ++k) {
      const std::int64_t bytes = chain.activation_bytes(static_cast<int>(k));
      c.cd[k] = chain.link->d2h_ms(bytes);
      c.ch[k] = chain.link->h2d_ms(bytes);
      // Members of x_k that stage k-1's autograd state keeps: its saved outputs, and the
      // members it carries from a saved input.
      const Stage& before = chain.stages[k - 1];
      for (const int o : before.saved_outputs)
        if (before.outputs[static_cast<std::size_t>(o)].bytes > 0) c.pinned[k] = true;
      for (const Member& member : before.outputs)
        for (const int saved : before.saved_inputs)
          if (member.carried_from == saved && member.bytes > 0) c.pinned[k] = true;
    }
  }
  return c;
}

}  // namespace detail
}  // namespace remat
