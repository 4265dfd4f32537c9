// Every solver algorithm on small chains of extreme values (sizes 0 to 2^50, times 0 to 1e308,
// infinities and NaN, tuples with members that have no gradient, a gradient of another size, or
// are carried over a stage),
// at the least budget, the store-all peak, the largest int64 and a budget from the input, with
// automatic or very few slots; and tradeoff. Either the chain or the options are refused as bad
// input (std::invalid_argument, ChainError among them), or the result holds: a feasible
// schedule's simulated peak is within the budget and its makespan is finite. An internal
// error (std::logic_error), a crash or a sanitizer report is a finding.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "remat/solver/chain.h"
#include "remat/solver/simulator.h"
#include "remat/solver/solver.h"
#include "remat/solver/tradeoff.h"

namespace {

std::int64_t size_from(FuzzedDataProvider& in) {
  static const std::int64_t extremes[] = {0, 1, 7, 4096, std::int64_t{1} << 40,
                                          std::int64_t{1} << 50, (std::int64_t{1} << 50) + 1};
  if (in.ConsumeBool()) return extremes[in.ConsumeIntegralInRange<size_t>(0, 6)];
  return in.ConsumeIntegralInRange<std::int64_t>(0, 64);
}

double time_from(FuzzedDataProvider& in) {
  static const double extremes[] = {0,      1e-300, 1e-9, 1,     1e15,
                                    1e15 + 1, 1e308, std::numeric_limits<double>::infinity(),
                                    std::nan(""), -1};
  if (in.ConsumeBool()) return extremes[in.ConsumeIntegralInRange<size_t>(0, 9)];
  return in.ConsumeIntegralInRange<int>(0, 100) * 0.5;
}

std::vector<remat::Member> members_from(FuzzedDataProvider& in, size_t previous) {
  std::vector<remat::Member> members(in.ConsumeIntegralInRange<size_t>(1, 3));
  for (remat::Member& member : members) {
    member.bytes = size_from(in);
    member.grad = in.ConsumeIntegralInRange<int>(0, 3) != 0;
    if (previous > 0 && in.ConsumeIntegralInRange<int>(0, 4) == 0) {
      member.carried_from = in.ConsumeIntegralInRange<int>(0, static_cast<int>(previous));
    }
  }
  return members;
}

remat::Chain chain_from(FuzzedDataProvider& in) {
  remat::Chain chain;
  chain.name = "fuzz";
  chain.inputs = members_from(in, 0);
  chain.context_bytes = in.ConsumeBool() ? size_from(in) : 0;
  const int length = in.ConsumeIntegralInRange<int>(1, 6);
  size_t previous = chain.inputs.size();
  for (int i = 0; i < length; ++i) {
    remat::Stage stage;
    stage.name = "s" + std::to_string(i);
    stage.fwd_ms = time_from(in);
    stage.bwd_ms = time_from(in);
    if (in.ConsumeBool()) stage.fwd_nograd_ms = time_from(in);
    stage.outputs = members_from(in, previous);
    for (size_t k = 0; k < previous; ++k) {
      if (in.ConsumeBool()) stage.saved_inputs.push_back(static_cast<int>(k));
    }
    for (size_t k = 0; k < stage.outputs.size(); ++k) {
      if (in.ConsumeBool()) stage.saved_outputs.push_back(static_cast<int>(k));
    }
    stage.state_bytes = size_from(in);
    stage.fwd_tmp_bytes = size_from(in);
    if (in.ConsumeBool()) stage.fwd_nograd_tmp_bytes = size_from(in);
    stage.bwd_tmp_bytes = size_from(in);
    previous = stage.outputs.size();
    chain.stages.push_back(std::move(stage));
  }
  chain.loss_tmp_bytes = size_from(in);
  chain.restart_ms = time_from(in);  // last: the committed seeds keep their chains
  // Gradients of other sizes than their members (Member::grad_bytes), after that for the same
  // reason: a new member's drawn (on a member without gradient too: refused), a carried one's
  // its source's where the source exists (else the chain is refused anyway).
  for (remat::Member& member : chain.inputs)
    if (in.ConsumeBool()) member.grad_bytes = size_from(in);
  for (std::size_t i = 0; i < chain.stages.size(); ++i) {
    const std::vector<remat::Member>& input =
        i == 0 ? chain.inputs : chain.stages[i - 1].outputs;
    for (remat::Member& member : chain.stages[i].outputs) {
      if (!member.carried()) {
        if (in.ConsumeBool()) member.grad_bytes = size_from(in);
      } else if (static_cast<std::size_t>(member.carried_from) < input.size()) {
        member.grad_bytes = input[static_cast<std::size_t>(member.carried_from)].grad_bytes;
      }
    }
  }
  return chain;
}

// A feasible schedule fits its budget, as the simulator (not the solver) measures it.
void check(const remat::Chain& chain, const remat::Solution& solution) {
  if (!solution.ok()) return;
  const remat::Simulation simulation = remat::simulate(chain, solution.sequence);
  if (simulation.peak_bytes > solution.budget_bytes) __builtin_trap();
  if (simulation.peak_bytes != solution.peak_bytes) __builtin_trap();
  if (!std::isfinite(solution.makespan_ms)) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const remat::Chain chain = chain_from(in);
  try {
    chain.validate("fuzz");
  } catch (const remat::ChainError&) {
    return 0;
  }
  const std::int64_t store_all = remat::store_all_peak(chain);
  const std::int64_t slots_choices[] = {0, 1, 2, 3, 100};
  const std::int64_t slots = slots_choices[in.ConsumeIntegralInRange<size_t>(0, 4)];
  const std::int64_t given = in.ConsumeIntegral<std::int64_t>();
  for (const remat::Algorithm algorithm :
       {remat::Algorithm::kOptimal, remat::Algorithm::kStoreAll, remat::Algorithm::kRecomputeAll,
        remat::Algorithm::kPeriodic, remat::Algorithm::kRevolve}) {
    remat::SolveOptions options = remat::SolveOptions(store_all)
                                      .algorithm(algorithm)
                                      .threads(1)
                                      .memory_limit_bytes(std::int64_t{256} << 20);
    if (algorithm == remat::Algorithm::kOptimal) options.slots(slots);
    try {
      const std::int64_t least = remat::min_feasible_budget(chain, options.budget_bytes(store_all));
      for (const std::int64_t budget :
           {least, store_all, std::numeric_limits<std::int64_t>::max(), given}) {
        if (budget < 0) continue;
        check(chain, remat::solve(chain, options.budget_bytes(budget)));
      }
    } catch (const std::invalid_argument&) {
      // Bad options for this chain (too many slots for the memory limit): bad input.
    }
  }
  try {
    remat::tradeoff(chain, remat::TradeoffOptions()
                               .points(in.ConsumeIntegralInRange<int>(1, 5))
                               .slots(slots)
                               .threads(1)
                               .memory_limit_bytes(std::int64_t{256} << 20));
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
