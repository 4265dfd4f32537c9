// Offload (docs/cost-model.md, "Offload"): the copies in the simulator, worked by hand; the
// dynamic program against every sequence of the offloading nested form, each replayed in the
// simulator (its own timing of copies and compute, its own storages); an infinitely slow link
// gives recomputation's optimum; the chain file's link.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "host_table.h"
#include "merged_chain.h"
#include "min_memory_table.h"
#include "persistent_table.h"
#include "remat/solver/simulator.h"
#include "remat/solver/solver.h"
#include "remat/solver/tradeoff.h"
#include "test_chains.h"
#include "unit_chain.h"

namespace remat {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool same_time(double a, double b) {
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::fabs(a - b) <= 1e-9 * std::max(1.0, std::fabs(a));
}

// Three stages of model v1, every activation 100 bytes, 100 bytes of state each; forwards
// 1 ms (0.5 without autograd), backwards 2 ms; a link of 1 ms latency that copies 100 bytes in
// 1.1 ms out (1000 bytes per ms, the least bandwidth) and 1.05 ms back (twice that).
Chain three_stages() {
  Chain chain = test::uniform_chain(3, 100, 1, 2, 100);
  chain.name = "three";
  for (Stage& stage : chain.stages) stage.fwd_nograd_ms = 0.5;
  chain.output_held = false;
  chain.link = Link{1e-3, 2e-3, 1.0};
  return chain;
}

// Every sequence of the offloading nested form (the dynamic program's family): a segment (i, l)
// runs a leaf, CF_i Fn_{i+1} .. Fn_{j-1}, then (j, l), then (i, j-1), or the same leaf
// offloading x_i, O_i CF_i .. Fn_{j-1} E_i, then (j, l) with P_i before its last operation,
// then (i, j-1); or the chain step Fe_i, (i+1, l), B_i. x_i may be offloaded from x_1 to x_{L-1},
// unless it came from Fe_{i-1} (a chain step: "taped") and stage i-1's backward keeps a member
// of it. Written from the model's text, apart from the solver's code.
class OffloadFamily {
 public:
  explicit OffloadFamily(const Chain& chain) : chain_(chain), length_(chain.length()) {}
  std::vector<Sequence> sequences() const { return nested(0, length_, false); }

 private:
  bool kept_by_previous(int i) const {
    const Stage& before = chain_.stages[static_cast<std::size_t>(i) - 1];
    for (const int o : before.saved_outputs)
      if (before.outputs[static_cast<std::size_t>(o)].bytes > 0) return true;
    for (const Member& member : before.outputs)
      if (member.carried() && member.bytes > 0 &&
          std::find(before.saved_inputs.begin(), before.saved_inputs.end(),
                    member.carried_from) != before.saved_inputs.end())
        return true;
    return false;
  }
  bool may_offload(int i, bool taped) const {
    return chain_.link && i >= 1 && i < length_ && !(taped && kept_by_previous(i));
  }
  std::vector<Sequence> nested(int i, int l, bool taped) const {
    if (i == l) return {i == length_ ? Sequence{loss(length_)} : Sequence{fe(i), bwd(i)}};
    std::vector<Sequence> out;
    for (int j = i + 1; j <= l; ++j) {
      const std::vector<Sequence> rights = nested(j, l, false);
      const std::vector<Sequence> lefts = nested(i, j - 1, taped);
      for (const Sequence& right : rights) {
        for (const Sequence& left : lefts) {
          Sequence plain{cf(i)};
          for (int k = i + 1; k < j; ++k) plain.push_back(fn(k));
          plain.insert(plain.end(), right.begin(), right.end());
          plain.insert(plain.end(), left.begin(), left.end());
          out.push_back(plain);
          if (!may_offload(i, taped)) continue;
          Sequence moved{offload(i), cf(i)};
          for (int k = i + 1; k < j; ++k) moved.push_back(fn(k));
          moved.push_back(evict(i));
          moved.insert(moved.end(), right.begin(), right.end() - 1);
          moved.push_back(prefetch(i));
          moved.push_back(right.back());
          moved.insert(moved.end(), left.begin(), left.end());
          out.push_back(moved);
        }
      }
    }
    for (const Sequence& rest : nested(i + 1, l, true)) {
      Sequence step{fe(i)};
      step.insert(step.end(), rest.begin(), rest.end());
      step.push_back(bwd(i));
      out.push_back(step);
    }
    return out;
  }
  const Chain& chain_;
  const int length_;
};

// The dynamic program's optimum in exact bytes (unit 1), with or without offload; +inf if it
// finds nothing. Its sequence in `sequence`.
double dp_value(const Chain& chain, std::int64_t budget, bool offload, Sequence* sequence) {
  const detail::UnitChain units = detail::make_unit_chain(chain, 1, true, false, offload);
  const detail::MinMemoryTable min_memory(units, budget);
  if (!detail::fits(units, min_memory, budget)) return kInf;
  const std::int64_t frame = budget - units.context;
  const detail::PersistentTable table(units, min_memory, frame, 1);
  if (sequence) *sequence = table.rebuild(frame);
  return table.value(0, chain.length(), frame);
}

// A random link: latencies from 0 to 4 ms (the chains' stages take 0.1 to 5 ms), bandwidths
// from 1 to 20 kB/ms (the chains' activations are a few bytes: the latency dominates).
Link random_link(std::uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 17);
  std::uniform_real_distribution<double> latency(0.0, 4.0), gbps(1e-3, 2e-2);
  Link link;
  link.latency_ms = std::uniform_int_distribution<int>(0, 3)(rng) == 0 ? 0.0 : latency(rng);
  link.d2h_gbps = gbps(rng);
  link.h2d_gbps = gbps(rng);
  return link;
}

struct Checked {
  int chains = 0, sequences = 0, budgets = 0, offloading = 0, faster = 0, below_recompute = 0;
};

// At every budget from the least any sequence of the family needs to the store-all peak: the
// DP's value is the fastest sequence of the family that fits (`exact`), or never below it; its
// sequence fits and takes the time it says.
void check_chain(const Chain& chain, bool exact, Checked& checked) {
  INFO(chain_to_json(chain));
  std::vector<std::pair<std::int64_t, double>> family;
  for (const Sequence& sequence : OffloadFamily(chain).sequences()) {
    const Simulation sim = simulate(chain, sequence);
    family.emplace_back(sim.peak_bytes, sim.makespan_ms);
    ++checked.sequences;
  }
  ++checked.chains;
  std::int64_t minimum = family.front().first;
  for (const auto& [peak, time] : family) minimum = std::min(minimum, peak);
  const std::int64_t top = store_all_peak(chain);
  const std::int64_t step = std::max<std::int64_t>(1, (top - minimum) / 8);
  for (std::int64_t budget = std::max<std::int64_t>(0, minimum - 1); budget <= top;
       budget += budget < minimum + 2 ? 1 : step) {
    INFO("budget " << budget);
    double best = kInf;
    for (const auto& [peak, time] : family)
      if (peak <= budget) best = std::min(best, time);
    Sequence sequence;
    const double got = dp_value(chain, budget, true, &sequence);
    ++checked.budgets;
    if (exact)
      CHECK(same_time(got, best));
    else
      CHECK((std::isinf(got) || got >= best - 1e-9 * std::max(1.0, best)));
    if (std::isinf(got)) continue;
    INFO("dp: " << collapsed_string(sequence));
    const Simulation sim = simulate(chain, sequence);
    CHECK(sim.peak_bytes <= budget);
    CHECK(same_time(sim.makespan_ms, got));
    if (sim.offloads > 0) ++checked.offloading;
    // Never slower than recomputation alone, which is in the family.
    const double recompute = dp_value(chain, budget, false, nullptr);
    CHECK(got <= recompute);
    if (got < recompute) ++checked.faster;
    if (std::isinf(recompute)) ++checked.below_recompute;
  }
}

// The table under a bound of `host` bytes on host memory, in exact bytes and host units of one
// byte; +inf if it finds nothing. Its sequence in `sequence`.
double host_dp_value(const Chain& chain, std::int64_t budget, std::int64_t host,
                     Sequence* sequence) {
  const detail::UnitChain units = detail::make_unit_chain(chain, 1, true, false, true);
  const detail::HostUnits host_units = detail::host_units(chain, host, 0);
  const detail::HostLevels levels(units, host_units);
  const detail::HostMinMemory least(units, levels);
  const std::int64_t frame = budget - units.context;
  if (frame - units.x[0] < 1 || least.at(0, chain.length(), false, host_units.capacity) > frame)
    return kInf;
  const detail::HostBoundedTable table(units, levels, least, frame);
  if (sequence) *sequence = table.rebuild(frame);
  return table.value(0, chain.length(), frame, false, host_units.capacity);
}

struct HostChecked {
  // binding: the bound makes the optimum slower; partly: slower, yet faster than offloading
  // nothing (some copies fit, not all that would pay).
  int chains = 0, bounds = 0, binding = 0, partly = 0, feasible = 0, solved = 0;
};

// At budgets from the family's least to the store-all peak and host bounds from 0 to the most
// any sequence of the family holds: the table's value is the fastest sequence of the family
// within both (`exact`), or never below it; its sequence fits both and takes the time it says;
// its least memory is the least of the family's sequences within the host bound.
void check_host_bounds(const Chain& chain, bool exact, HostChecked& checked) {
  INFO(chain_to_json(chain));
  struct Run {
    std::int64_t peak, host;
    double time;
  };
  std::vector<Run> family;
  std::int64_t most_host = 0;
  for (const Sequence& sequence : OffloadFamily(chain).sequences()) {
    const Simulation sim = simulate(chain, sequence);
    family.push_back({sim.peak_bytes, sim.host_peak_bytes, sim.makespan_ms});
    most_host = std::max(most_host, sim.host_peak_bytes);
  }
  ++checked.chains;
  const std::int64_t top = store_all_peak(chain);
  const detail::UnitChain units = detail::make_unit_chain(chain, 1, true, false, true);
  for (std::int64_t host = 0; host <= most_host + 1;
       host += std::max<std::int64_t>(1, most_host / 5)) {
    INFO("host bound " << host);
    ++checked.bounds;
    std::int64_t least = top;
    for (const Run& run : family)
      if (run.host <= host) least = std::min(least, run.peak);
    // The least memory under the bound, in exact bytes.
    const detail::HostUnits host_units = detail::host_units(chain, host, 0);
    const detail::HostLevels levels(units, host_units);
    const std::int64_t table_least =
        units.context +
        std::max<std::int64_t>(
            units.x[0] + 1,
            detail::HostMinMemory(units, levels).at(0, chain.length(), false, host_units.capacity));
    if (exact)
      CHECK(table_least == least);
    else
      CHECK(table_least >= least);
    const std::int64_t step = std::max<std::int64_t>(1, (top - least) / 6);
    for (std::int64_t budget = std::max<std::int64_t>(0, least - 1); budget <= top;
         budget += budget < least + 2 ? 1 : step) {
      INFO("budget " << budget);
      double best = kInf, unbounded = kInf, nothing = kInf;
      for (const Run& run : family) {
        if (run.peak > budget) continue;
        unbounded = std::min(unbounded, run.time);
        if (run.host <= host) best = std::min(best, run.time);
        if (run.host == 0) nothing = std::min(nothing, run.time);
      }
      Sequence sequence;
      const double got = host_dp_value(chain, budget, host, &sequence);
      if (exact)
        CHECK(same_time(got, best));
      else
        CHECK((std::isinf(got) || got >= best - 1e-9 * std::max(1.0, best)));
      if (best > unbounded) ++checked.binding;
      if (best > unbounded && best < nothing) ++checked.partly;
      // solve() under the bound, in host units of one byte: the table's optimum, or the
      // unbounded optimum's sequence with the fewest copies where that one is within it (or,
      // where the table is not exact, store-all at the store-all peak).
      const Solution solved =
          solve(chain, SolveOptions(budget).offload(true).host_memory_bytes(host).host_slots(
                           std::max<std::int64_t>(1, host)));
      INFO("solve(): " << status_name(solved.status) << " " << collapsed_string(solved.sequence)
                       << ", host " << solved.simulation.host_peak_bytes << ", "
                       << solved.makespan_ms << " ms");
      if (exact) {
        CHECK(solved.ok() == !std::isinf(best));
        if (solved.ok()) CHECK(same_time(solved.makespan_ms, best));
      } else if (solved.ok()) {
        CHECK(solved.makespan_ms >= best - 1e-9 * std::max(1.0, best));
        CHECK((std::isinf(got) || solved.makespan_ms <= got + 1e-9 * std::max(1.0, got)));
      }
      if (solved.ok()) {
        CHECK(solved.peak_bytes <= budget);
        CHECK(solved.simulation.host_peak_bytes <= host);
        ++checked.solved;
      }
      if (std::isinf(got)) continue;
      ++checked.feasible;
      INFO("dp: " << collapsed_string(sequence));
      const Simulation sim = simulate(chain, sequence);
      CHECK(sim.peak_bytes <= budget);
      CHECK(sim.host_peak_bytes <= host);
      CHECK(same_time(sim.makespan_ms, got));
    }
  }
}

}  // namespace

TEST_CASE("copies: the simulator's worked example", "[solver][offload]") {
  const Chain chain = three_stages();
  // x_1 offloaded while Fn_1 runs, evicted before the right part (2, 3), prefetched during B_2.
  const Sequence sequence =
      parse_sequence("CF_0 O_1 CF_1 E_1 Fe_2 L P_1 B_2 Fe_1 B_1 Fe_0 B_0", chain.length());
  const Simulation sim = simulate(chain, sequence);
  // Time: CF_0 0.5; O_1 starts with CF_1 at 0.5 and ends at 0.5 + 1 + 100 / 1000 = 1.6, while
  // CF_1 ends at 1.0: E_1 waits 0.6. Fe_2 1.6 .. 2.6, the loss takes no time, P_1 starts with
  // B_2 at 2.6 and ends at 2.6 + 1 + 100 / 2000 = 3.65, B_2 ends at 4.6: no wait. Fe_1, B_1,
  // Fe_0, B_0: 6 ms more.
  CHECK(sim.copy_wait_ms == Approx(0.6));
  CHECK(sim.makespan_ms == Approx(10.6));
  CHECK(sim.offloads == 1);
  CHECK(sim.host_peak_bytes == 100);
  CHECK(sim.trace[1].start_ms == Approx(0.5));
  CHECK(sim.trace[1].end_ms == Approx(1.6));
  CHECK(sim.trace[6].start_ms == Approx(2.6));
  CHECK(sim.trace[6].end_ms == Approx(3.65));
  // Memory: x_0 (100) is the caller's. CF_1 runs with x_0, x_1 and x_2 (300); after E_1, x_0 and
  // x_2. Fe_2: + x_3 and state (100 each): 400; L: + y_3: 500. P_1: 600; B_2: + y_2: 700.
  CHECK(sim.trace[2].during.total() == 300);
  CHECK(sim.trace[3].live_after_bytes == 200);
  CHECK(sim.trace[6].during.total() == 600);
  CHECK(sim.peak_bytes == 700);
  // Without the offload the same schedule keeps x_1 throughout: 100 more at B_2.
  const Simulation kept =
      simulate(chain, parse_sequence("CF_0 CF_1 Fe_2 L B_2 Fe_1 B_1 Fe_0 B_0", chain.length()));
  CHECK(kept.peak_bytes == 700);
  CHECK(kept.trace[4].during.total() == 700);
  CHECK(kept.makespan_ms == Approx(10.0));
}

TEST_CASE("copies: a copy back is waited for by the first read, after the restart",
          "[solver][offload]") {
  Chain chain = three_stages();
  chain.restart_ms = 0.25;
  chain.link = Link{1e-3, 1e-3, 2.0};  // 2.1 ms each way
  const Simulation sim = simulate(
      chain, parse_sequence("CF_0 O_1 CF_1 Fn_2 E_1 L P_1 Fe_2 B_2 Fe_1 B_1 Fe_0 B_0", 3));
  // CF_0 0.5, CF_1 and Fn_2 1.0 (the copy out 0.5 .. 2.6: E_1 waits 1.1), the loss at 2.6.
  // P_1 starts with Fe_2 at 2.6 (the loss is no backward: no restart) and ends at 4.7; Fe_2
  // 2.6 .. 3.6, B_2 .. 5.6; Fe_1 restarts (5.85): no wait. Then 1 + 2 + 0.25 + 1 + 2.
  CHECK(sim.copy_wait_ms == Approx(1.1));
  CHECK(sim.restarts == 2);
  CHECK(sim.makespan_ms == Approx(5.6 + 0.25 + 3 + 0.25 + 3));
  // A prefetch started by the backward right before the read: waited for after the restart.
  const Simulation late = simulate(
      chain, parse_sequence("CF_0 O_1 CF_1 E_1 Fe_2 L P_1 B_2 Fe_1 B_1 Fe_0 B_0", 3));
  // CF_0 0.5, CF_1 .. 1.0, E_1 waits to 2.6, Fe_2 .. 3.6, B_2 3.6 .. 5.6 with P_1 3.6 .. 5.7;
  // Fe_1 would start at 5.85 after its restart: no wait.
  CHECK(late.copy_wait_ms == Approx(1.6));
  CHECK(late.makespan_ms == Approx(5.6 + 0.25 + 3 + 0.25 + 3));
}

TEST_CASE("copies: sequences that break the rules are refused, naming the operation",
          "[solver][offload]") {
  const Chain chain = three_stages();
  const auto refused = [&](const std::string& text, const std::string& reason) {
    INFO(text);
    try {
      simulate(chain, parse_sequence(text, chain.length()));
      FAIL("accepted");
    } catch (const InvalidSequenceError& e) {
      CHECK_THAT(e.what(), Catch::Contains(reason));
    }
  };
  refused("CF_0 O_1 E_1 CF_1 Fe_2 L B_2 Fe_1 B_1 Fe_0 B_0", "has not started");
  refused("O_0 Fe_0 Fe_1 Fe_2 L B_2 B_1 B_0", "x_0 is the caller's");
  refused("CF_0 P_1 Fe_1 Fe_2 L B_2 B_1 Fe_0 B_0", "no copy in host memory");
  refused("CF_0 O_1 CF_1 Fe_2 L B_2 Fe_1 B_1 Fe_0 B_0", "no E_1 follows");
  refused("CF_0 O_1 CF_1 P_1 E_1 Fe_2 L B_2 Fe_1 B_1 Fe_0 B_0", "has not been evicted");
  refused("CF_0 O_1 CF_1 E_1 E_1 Fe_2 L P_1 B_2 Fe_1 B_1 Fe_0 B_0", "x_1 is not offloaded");
  refused("CF_0 O_1 O_1 CF_1 E_1 Fe_2 L P_1 B_2 Fe_1 B_1 Fe_0 B_0", "no E_1 follows");
  refused("CF_0 O_1 CF_1 E_1 Fe_2 L B_2 Fe_0 O_1 Fe_1 E_1 B_1 B_0", "already has a copy");
  refused("CF_0 O_1 CF_1 E_1 Fe_2 L B_2 Fe_1 B_1 Fe_0 B_0", "x_1 is not in memory");
  Chain linkless = chain;
  linkless.link.reset();
  CHECK_THROWS_WITH(simulate(linkless, parse_sequence("CF_0 O_1 CF_1 E_1 Fe_2 L P_1 B_2 Fe_1 "
                                                      "B_1 Fe_0 B_0",
                                                      3)),
                    Catch::Contains("no link"));
}

TEST_CASE("offload: the DP is the fastest offloading nested schedule on chains of model v1",
          "[solver][offload][oracle]") {
  Checked checked;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    test::RandomChainSpec spec;
    spec.max_length = 5;
    spec.max_bytes = 12;
    Chain chain = test::random_chain(seed, spec);
    chain.link = random_link(seed);
    check_chain(chain, true, checked);
  }
  INFO(checked.chains << " chains, " << checked.sequences << " sequences, " << checked.budgets
                      << " budgets");
  CHECK(checked.offloading >= 20);  // the DP offloads at many budgets,
  CHECK(checked.faster >= 5);       // faster than recomputation alone
}

TEST_CASE("offload: the DP is the fastest offloading nested schedule when stages keep part of "
          "their input and output, with restarts",
          "[solver][offload][oracle]") {
  Checked checked;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    test::RandomChainSpec spec;
    spec.max_length = 5;
    spec.max_bytes = 12;
    spec.partial_keeps = true;
    spec.restarts = true;
    Chain chain = test::random_chain(seed, spec);
    chain.link = random_link(seed);
    // The caller's x_L held to the end: the prefetch beside B_{L-1} right after the loss counts
    // it whole (UnitChain::last_backward_memory), never below, possibly above the fastest.
    check_chain(chain, !chain.output_held, checked);
  }
  CHECK(checked.offloading >= 20);
  // A taped checkpoint beside a chain step that recomputation would have to keep: offloaded,
  // some budgets become feasible.
  CHECK(checked.below_recompute >= 1);
}

TEST_CASE("offload: with carried members the DP never overruns", "[solver][offload][oracle]") {
  Checked checked;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    Chain chain = test::random_chain(seed, test::carried_spec(5));
    chain.link = random_link(seed);
    check_chain(chain, false, checked);
  }
  CHECK(checked.chains == 40);
}

TEST_CASE("offload: solve() on chains with carried members, merged runs included",
          "[solver][offload]") {
  // A fast link: where a checkpoint fits the budget only off the device, it goes there. Every
  // strategy of solve() runs (the table, the merged chain's, the storage-exact table's), each
  // sequence is checked by the simulator, and offloading never makes the optimum slower.
  int offloading = 0, merged_offloading = 0, solved = 0;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    Chain chain = test::random_chain(seed, test::carried_spec(6));
    chain.link = Link{1e4, 1e4, 0};
    INFO(chain_to_json(chain));
    const std::int64_t top = store_all_peak(chain);
    for (int k = 1; k <= 6; ++k) {
      const std::int64_t budget = top * k / 6;
      const Solution with = solve(chain, SolveOptions(budget).offload(true));
      const Solution without = solve(chain, SolveOptions(budget));
      INFO("budget " << budget << ": " << collapsed_string(with.sequence));
      if (without.ok()) CHECK(with.ok());
      if (!with.ok()) continue;
      ++solved;
      CHECK(with.peak_bytes <= budget);
      const Simulation replayed = simulate(chain, with.sequence);
      CHECK(replayed.peak_bytes == with.simulation.peak_bytes);
      CHECK(replayed.makespan_ms == with.simulation.makespan_ms);
      if (without.ok()) CHECK(with.makespan_ms <= without.makespan_ms * (1 + 1e-12));
      offloading += with.simulation.offloads > 0;
      merged_offloading += with.simulation.offloads > 0 && with.merged_stages > 0;
    }
  }
  // The counts on these 30 fixed chains (most of their budgets below any schedule's least).
  CHECK(solved >= 45);
  CHECK(offloading >= 5);
}

TEST_CASE("offload: a merged chain's offloading sequence expands to the chain's",
          "[solver][offload]") {
  // The merged chain's x_c is the chain's x_{first[c]}: its O_c, E_c and P_c become the chain's
  // O, E and P of that activation, with the same peak and time.
  int expanded = 0;
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    test::RandomChainSpec spec = test::carried_spec(8);
    Chain chain = test::random_chain(seed, spec);
    chain.link = Link{1e4, 1e4, 0};
    const std::optional<detail::MergedChain> merged = detail::merge_carried_runs(chain);
    if (!merged) continue;
    REQUIRE(merged->chain.link.has_value());
    INFO(chain_to_json(chain));
    const std::int64_t top = store_all_peak(merged->chain);
    for (int k = 1; k <= 8; ++k) {
      const Solution s = solve(merged->chain, SolveOptions(top * k / 8).offload(true));
      if (!s.ok() || s.simulation.offloads == 0) continue;
      const Sequence fine = detail::expand_merged(s.sequence, merged->first);
      INFO(collapsed_string(s.sequence) << "\nexpanded: " << collapsed_string(fine));
      const Simulation sim = simulate(chain, fine);
      CHECK(sim.offloads == s.simulation.offloads);
      CHECK(sim.peak_bytes <= s.simulation.peak_bytes);
      CHECK(sim.makespan_ms == Approx(s.simulation.makespan_ms).epsilon(1e-12));
      CHECK(sim.host_peak_bytes == s.simulation.host_peak_bytes);
      ++expanded;
    }
  }
  CHECK(expanded >= 9);  // of these 200 fixed chains
}

TEST_CASE("offload: an infinitely slow link gives recomputation's optimum", "[solver][offload]") {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    test::RandomChainSpec spec;
    spec.max_length = 7;
    spec.partial_keeps = true;
    Chain chain = test::random_chain(seed, spec);
    chain.link = Link{kMinLinkGbps, kMinLinkGbps, kMaxStageMs};
    INFO(chain_to_json(chain));
    const std::int64_t top = store_all_peak(chain);
    for (std::int64_t budget = 0; budget <= top; budget += std::max<std::int64_t>(1, top / 12)) {
      const double without = dp_value(chain, budget, false, nullptr);
      if (std::isinf(without)) continue;
      CHECK(dp_value(chain, budget, true, nullptr) == without);
    }
  }
}

TEST_CASE("offload: solve() offloads where the link makes it pay", "[solver][offload]") {
  // Eight equal stages of model v1, a fast link: at half the store-all peak, checkpoints sent
  // to host memory replace recomputations.
  Chain chain = test::uniform_chain(8, 1000, 1, 2, 1000);
  chain.name = "eight";
  chain.link = Link{10, 10, 0.01};
  const std::int64_t budget = store_all_peak(chain) / 2;
  const Solution offloading = solve(chain, SolveOptions(budget).offload(true));
  const Solution recompute = solve(chain, SolveOptions(budget));
  REQUIRE(offloading.ok());
  REQUIRE(recompute.ok());
  CHECK(offloading.peak_bytes <= budget);
  CHECK(offloading.simulation.offloads > 0);
  CHECK(offloading.simulation.makespan_ms < recompute.simulation.makespan_ms);
  CHECK(offloading.simulation.nograd_forwards < recompute.simulation.nograd_forwards);
  // The least budget is recomputation's here: recomputing every stage from x_0 alone, which is
  // the caller's, already needs the least memory any schedule can.
  CHECK(min_feasible_budget(chain, SolveOptions(0).offload(true)) ==
        min_feasible_budget(chain, SolveOptions(0)));
  // A slow link: nothing is offloaded, the schedule is recomputation's.
  chain.link = Link{kMinLinkGbps, kMinLinkGbps, 1000};
  const Solution slow = solve(chain, SolveOptions(budget).offload(true));
  CHECK(slow.simulation.offloads == 0);
  CHECK(slow.simulation.makespan_ms == Approx(recompute.simulation.makespan_ms));
  // Offload needs a link.
  chain.link.reset();
  CHECK_THROWS_WITH(solve(chain, SolveOptions(budget).offload(true)),
                    Catch::Contains("no link to host memory"));
}

TEST_CASE("offload: tradeoff's offloading points are solve()'s, never slower than optimal's",
          "[solver][offload]") {
  Chain chain;
  chain.name = "twelve";
  chain.set_input(1000);
  for (int i = 0; i < 12; ++i) {
    Stage stage = Stage::keeping_all("s" + std::to_string(i), 1000 + 100 * (i % 3), 2000);
    stage.fwd_ms = 1 + 0.25 * (i % 4);
    stage.bwd_ms = 2;
    chain.stages.push_back(stage);
  }
  chain.link = Link{10, 10, 0.05};
  const Tradeoff t = tradeoff(chain, TradeoffOptions().points(8).offload(true));
  REQUIRE(t.offloading.size() == t.budgets.size());
  int offloading = 0;
  for (std::size_t k = 0; k < t.budgets.size(); ++k) {
    INFO("budget " << t.budgets[k]);
    const Solution own = solve(chain, SolveOptions(t.budgets[k]).offload(true));
    REQUIRE(t.offloading[k].feasible == own.ok());
    if (!own.ok()) continue;
    CHECK(t.offloading[k].makespan_ms == own.simulation.makespan_ms);
    CHECK(t.offloading[k].peak_bytes <= t.budgets[k]);
    CHECK(t.offloading[k].parameter == own.simulation.offloads);
    if (t.optimal[k].feasible)
      CHECK(t.offloading[k].makespan_ms <= t.optimal[k].makespan_ms * (1 + 1e-12));
    if (t.offloading[k].parameter > 0) ++offloading;
  }
  CHECK(offloading >= 2);
  CHECK(tradeoff(chain, TradeoffOptions().points(4)).offloading.empty());
  chain.link.reset();
  CHECK_THROWS_WITH(tradeoff(chain, TradeoffOptions().offload(true)),
                    Catch::Contains("no link to host memory"));
}

TEST_CASE("the chain file keeps the link as version 3, and stays version 2 without one",
          "[solver][offload][chain]") {
  Chain chain = three_stages();
  const std::string text = chain_to_json(chain);
  CHECK_THAT(text, Catch::Contains("\"remat-chain/3\""));
  const Chain back = parse_chain(text, "linked.json");
  REQUIRE(back.link);
  CHECK(back.link->d2h_gbps == chain.link->d2h_gbps);
  CHECK(back.link->h2d_gbps == chain.link->h2d_gbps);
  CHECK(back.link->latency_ms == chain.link->latency_ms);
  chain.link.reset();
  CHECK_THAT(chain_to_json(chain), Catch::Contains("\"remat-chain/2\""));
  // A link in a version 2 file is an unknown field; bad bandwidths are named.
  std::string v2 = text;
  v2.replace(v2.find("remat-chain/3"), 13, "remat-chain/2");
  CHECK_THROWS_WITH(parse_chain(v2, "v2.json"), Catch::Contains("link"));
  std::string zero = text;
  zero.replace(zero.find("\"d2h_gbps\": 0.001"), 17, "\"d2h_gbps\": 0");
  CHECK_THROWS_WITH(parse_chain(zero, "zero.json"),
                    Catch::Contains("zero.json: link.d2h_gbps (0) must be a bandwidth"));
  std::string missing = text;
  missing.replace(missing.find("\"latency_ms\""), 12, "\"latency\"");
  CHECK_THROWS_WITH(parse_chain(missing, "missing.json"), Catch::Contains("link"));
}

TEST_CASE("host bound: the table is the fastest offloading nested schedule within both bounds",
          "[solver][offload][oracle]") {
  HostChecked checked;
  for (std::uint64_t seed = 1; seed <= 80; ++seed) {
    test::RandomChainSpec spec;
    spec.max_length = 5;
    spec.max_bytes = 12;
    spec.partial_keeps = seed % 2 == 0;
    spec.restarts = seed % 3 == 0;
    Chain chain = test::random_chain(seed, spec);
    // Half with a link that costs nothing but its bandwidth: copies pay, and nest.
    chain.link = seed % 2 == 0 ? Link{1e-2, 1e-2, 0} : random_link(seed);
    // The caller's x_L held to the end: exact only without it (as without a host bound).
    check_host_bounds(chain, !spec.partial_keeps || !chain.output_held, checked);
  }
  // Equal stages and a free link: at tight budgets the fastest schedules keep several copies
  // on the host at once, nested, which a bound lets through in part.
  for (const int length : {4, 5, 6}) {
    Chain chain = test::uniform_chain(length, 10, 1, 2, 10);
    chain.output_held = false;
    chain.link = Link{1e-2, 1e-2, 0};
    check_host_bounds(chain, true, checked);
  }
  INFO(checked.chains << " chains, " << checked.bounds << " host bounds, " << checked.binding
                      << " binding, " << checked.partly << " partly, " << checked.feasible
                      << " feasible");
  CHECK(checked.binding >= 20);  // the bound changes the optimum at many budgets,
  CHECK(checked.partly >= 6);    // and lets some copies through at some
  CHECK(checked.solved >= checked.feasible);
  CHECK(checked.feasible >= 2000);
}

TEST_CASE("host bound: with carried members the table never overruns either bound",
          "[solver][offload][oracle]") {
  HostChecked checked;
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    Chain chain = test::random_chain(seed, test::carried_spec(5));
    chain.link = random_link(seed);
    check_host_bounds(chain, false, checked);
  }
  CHECK(checked.chains == 20);
}

TEST_CASE("host bound: above what any schedule holds, the table is the persistent table",
          "[solver][offload]") {
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    test::RandomChainSpec spec;
    spec.max_length = 9;
    spec.partial_keeps = seed % 2 == 0;
    Chain chain = test::random_chain(seed, spec);
    chain.link = random_link(seed);
    INFO(chain_to_json(chain));
    const detail::UnitChain units = detail::make_unit_chain(chain, 1, true, false, true);
    std::int64_t all = 0;
    for (int i = 1; i < chain.length(); ++i) all += chain.activation_bytes(i);
    const std::int64_t top = store_all_peak(chain);
    const detail::MinMemoryTable min_memory(units);
    const detail::HostUnits host = detail::host_units(chain, all, 0);
    const detail::HostLevels levels(units, host);
    const detail::HostMinMemory least(units, levels);
    const std::int64_t frame = top - units.context;
    const detail::PersistentTable table(units, min_memory, frame, 1);
    const detail::HostBoundedTable bounded(units, levels, least, frame);
    int differences = 0, compared = 0;
    for (int i = 0; i <= chain.length(); ++i)
      for (int l = i; l <= chain.length(); ++l)
        for (const bool taped : {false, true}) {
          CHECK(least.at(i, l, taped, host.capacity) == min_memory.at(i, l, taped));
          for (std::int64_t m = 0; m <= frame; ++m, ++compared)
            differences +=
                table.value(i, l, m, taped) == bounded.value(i, l, m, taped, host.capacity) ? 0 : 1;
        }
    CHECK(differences == 0);
    CHECK(compared > 0);
  }
}

TEST_CASE("host bound: the table's levels side by side on two threads are the same",
          "[solver][offload]") {
  int parallel = 0;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    test::RandomChainSpec spec;
    spec.min_length = 12;
    spec.max_length = 14;
    spec.max_bytes = 400;
    spec.partial_keeps = seed % 2 == 0;
    Chain chain = test::random_chain(seed, spec);
    chain.link = Link{1e-2, 1e-2, 0};
    INFO(chain_to_json(chain));
    const detail::UnitChain units = detail::make_unit_chain(chain, 1, true, false, true);
    std::int64_t all = 0;
    for (int i = 1; i < chain.length(); ++i) all += chain.activation_bytes(i);
    const detail::HostUnits host = detail::host_units(chain, all / 2, 8);
    const detail::HostLevels levels(units, host);
    const detail::HostMinMemory least(units, levels);
    const std::int64_t frame = store_all_peak(chain) - units.context;
    // Segments of 7 stages and more are handed to the workers (kParallelWork) from 3000 units.
    if (frame >= 3000) ++parallel;
    const detail::HostBoundedTable one(units, levels, least, frame, 1);
    const detail::HostBoundedTable two(units, levels, least, frame, 2);
    int differences = 0;
    for (int i = 0; i <= chain.length(); ++i)
      for (int l = i; l <= chain.length(); ++l)
        for (const bool taped : {false, true})
          for (std::int64_t k = 0; k <= host.capacity; ++k)
            for (std::int64_t m = 0; m <= frame; m += 7)
              differences += one.value(i, l, m, taped, k) == two.value(i, l, m, taped, k) ? 0 : 1;
    CHECK(differences == 0);
    CHECK(collapsed_string(one.rebuild(frame)) == collapsed_string(two.rebuild(frame)));
  }
  CHECK(parallel >= 3);
}

TEST_CASE("host bound: solve() keeps the copies within it", "[solver][offload]") {
  Chain chain = test::uniform_chain(8, 1000, 1, 2, 1000);
  chain.name = "eight";
  chain.link = Link{10, 10, 0.01};
  const std::int64_t budget = store_all_peak(chain) / 2;
  const Solution free = solve(chain, SolveOptions(budget).offload(true));
  REQUIRE(free.ok());
  REQUIRE(free.simulation.host_peak_bytes >= 3000);
  // A bound no lower than what the fastest schedule holds changes nothing.
  const Solution loose = solve(
      chain, SolveOptions(budget).offload(true).host_memory_bytes(free.simulation.host_peak_bytes));
  CHECK(collapsed_string(loose.sequence) == collapsed_string(free.sequence));
  CHECK(loose.status == SolveStatus::kOptimal);
  // Tighter bounds: the copies stay within each, never faster as the bound shrinks, down to
  // recomputation's schedule at 0.
  double previous = free.makespan_ms;
  for (const std::int64_t bound : {free.simulation.host_peak_bytes - 1000, std::int64_t{1000},
                                   std::int64_t{999}, std::int64_t{0}}) {
    INFO("host bound " << bound);
    const Solution bounded =
        solve(chain, SolveOptions(budget).offload(true).host_memory_bytes(bound));
    REQUIRE(bounded.ok());
    CHECK(bounded.status == SolveStatus::kOptimal);
    CHECK(bounded.peak_bytes <= budget);
    CHECK(bounded.simulation.host_peak_bytes <= bound);
    CHECK(bounded.makespan_ms >= previous);
    previous = bounded.makespan_ms;
  }
  CHECK(previous == Approx(solve(chain, SolveOptions(budget)).makespan_ms));
  CHECK(solve(chain, SolveOptions(budget).offload(true).host_memory_bytes(1000)).makespan_ms >
        free.makespan_ms);
  // Bad options are refused, naming them.
  CHECK_THROWS_WITH(
      solve(chain, SolveOptions(budget).host_memory_bytes(1000)),
      Catch::Contains("host_memory_bytes (1000) bounds the offloaded copies: it needs offload"));
  CHECK_THROWS_WITH(solve(chain, SolveOptions(budget).offload(true).host_memory_bytes(-2)),
                    Catch::Contains("host_memory_bytes (-2) must be at least 0"));
  CHECK_THROWS_WITH(
      solve(chain, SolveOptions(budget).offload(true).host_memory_bytes(10).host_slots(0)),
      Catch::Contains("host_slots (0) must be from 1 to 4096"));
}

TEST_CASE("host bound: the least budget under it", "[solver][offload]") {
  // Where offloading lowers the least budget (a taped checkpoint beside a chain step that
  // recomputation would keep), a host bound of 0 gives recomputation's back.
  int lower = 0;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    test::RandomChainSpec spec;
    spec.max_length = 5;
    spec.max_bytes = 12;
    spec.partial_keeps = true;
    Chain chain = test::random_chain(seed, spec);
    chain.link = random_link(seed);
    INFO(chain_to_json(chain));
    const std::int64_t with = min_feasible_budget(chain, SolveOptions(0).offload(true));
    const std::int64_t without = min_feasible_budget(chain, SolveOptions(0));
    if (with < without) ++lower;
    CHECK(min_feasible_budget(chain, SolveOptions(0).offload(true).host_memory_bytes(0)) ==
          without);
    CHECK(min_feasible_budget(chain, SolveOptions(0).offload(true).host_memory_bytes(1 << 20)) ==
          with);
  }
  CHECK(lower >= 1);
}

}  // namespace remat
