// The work of the persistent table, counted, on fixed chains: a guard against a large slowdown
// landing unseen. Time is noisy on shared machines; the number of candidate values the dynamic
// program computes is not, and its time follows it (docs/performance.md, "Solver").
//
// Updating a figure: when a change to the table's order or pruning moves a count on purpose,
// run `remat_solver_tests "[work]" -s`, which prints every count, and commit the new figures
// below with the change (the commit message saying why). A count that falls below two thirds
// of its figure is reported, so that the figure follows improvements.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "discretization.h"
#include "min_memory_table.h"
#include "persistent_table.h"
#include "remat/solver/chain.h"
#include "remat/solver/solver.h"
#include "unit_chain.h"

namespace remat {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;
// A count may grow by this factor over its figure before the test fails.
constexpr double kMargin = 1.5;

// Uniform in [lo, hi) from raw mt19937_64 output, which the standard specifies (unlike its
// distributions): the same chains with every standard library.
double uniform(std::mt19937_64& engine, double lo, double hi) {
  return lo + (hi - lo) * (static_cast<double>(engine() >> 11) * 0x1.0p-53);
}

// bench/solver_bench's CNN-like chain of model v1 (every stage keeps its input and output).
Chain cnn_chain(int length) {
  std::mt19937_64 engine(20240611);
  Chain chain;
  chain.set_input(16 * kMiB);
  chain.loss_tmp_bytes = kMiB;
  for (int i = 0; i < length; ++i) {
    const auto out = static_cast<std::int64_t>(std::exp2(uniform(engine, 20.0, 26.0)));
    const auto saved = static_cast<std::int64_t>(out * uniform(engine, 1.0, 4.0));
    Stage stage = Stage::keeping_all("s" + std::to_string(i), out, saved);
    const double has_fwd_tmp = uniform(engine, 0.0, 1.0);
    const double fwd_tmp = uniform(engine, 0.0, 1.0);
    const double has_bwd_tmp = uniform(engine, 0.0, 1.0);
    const double bwd_tmp = uniform(engine, 0.0, 1.0);
    if (has_fwd_tmp < 0.2) stage.fwd_tmp_bytes = static_cast<std::int64_t>(out * fwd_tmp);
    if (has_bwd_tmp < 0.2) stage.bwd_tmp_bytes = static_cast<std::int64_t>(out * bwd_tmp);
    stage.fwd_ms = uniform(engine, 0.1, 5.0);
    stage.bwd_ms = stage.fwd_ms * uniform(engine, 1.5, 2.5);
    stage.fwd_nograd_ms = stage.fwd_ms * uniform(engine, 0.9, 1.0);
    chain.stages.push_back(std::move(stage));
  }
  return chain;
}

// A chain of model v2 in threes, convolution (keeps its input), ReLU (keeps its output), dropout
// (keeps its mask only): the dropout's input is held after its forward only when the ReLU made
// it, so its segment starts have two states (fresh and taped rows).
Chain layered_chain(int length) {
  std::mt19937_64 engine(20261128);
  Chain chain;
  chain.set_input(8 * kMiB);
  chain.loss_tmp_bytes = kMiB;
  for (int i = 0; i < length; ++i) {
    Stage stage;
    stage.name = "s" + std::to_string(i);
    const auto out = static_cast<std::int64_t>(std::exp2(uniform(engine, 20.0, 25.0)));
    stage.outputs = {Member{out}};
    if (i % 3 == 0) stage.saved_inputs = {0};
    if (i % 3 == 1) stage.saved_outputs = {0};
    if (i % 3 == 2) stage.state_bytes = out / 8;
    stage.fwd_ms = uniform(engine, 0.1, 5.0);
    stage.bwd_ms = stage.fwd_ms * uniform(engine, 1.5, 2.5);
    chain.stages.push_back(std::move(stage));
  }
  return chain;
}

// The table `remat schedule --slots` builds at `fraction` of the store-all peak.
detail::TableStats table_work(const Chain& chain, double fraction, std::int64_t slots,
                              int threads) {
  chain.validate();
  const auto budget =
      static_cast<std::int64_t>(fraction * static_cast<double>(store_all_peak(chain)));
  const Discretization disc = detail::discretize(budget, slots);
  const detail::UnitChain units = detail::make_unit_chain(chain, disc.unit_bytes, true);
  const detail::MinMemoryTable min_memory(units, disc.capacity_units);
  REQUIRE(detail::fits(units, min_memory, disc.capacity_units));
  const detail::PersistentTable table(units, min_memory, disc.capacity_units - units.context,
                                      threads);
  return table.stats();
}

struct Figure {
  const char* name;
  Chain chain;
  double fraction;
  std::int64_t slots;
  std::int64_t candidates;  // committed figures
  std::int64_t values;
};

TEST_CASE("persistent table work stays within its committed figures", "[solver][work]") {
  const Figure figures[] = {
      {"cnn L=100 40% 500 slots", cnn_chain(100), 0.4, 500, 176750, 25458160},
      {"cnn L=150 40% 1000 slots", cnn_chain(150), 0.4, 1000, 585125, 117682454},
      {"layered L=120 50% 500 slots", layered_chain(120), 0.5, 500, 400860, 49226149},
  };
  for (const Figure& figure : figures) {
    const detail::TableStats one = table_work(figure.chain, figure.fraction, figure.slots, 1);
    const detail::TableStats two = table_work(figure.chain, figure.fraction, figure.slots, 2);
    INFO(figure.name << ": " << one.candidates << " candidates, " << one.values
                     << " values (committed: " << figure.candidates << ", " << figure.values
                     << ")");
    // The order of the candidates does not depend on the threads, nor then the work.
    CHECK(one.candidates == two.candidates);
    CHECK(one.values == two.values);
    CHECK(static_cast<double>(one.candidates) <= kMargin * static_cast<double>(figure.candidates));
    CHECK(static_cast<double>(one.values) <= kMargin * static_cast<double>(figure.values));
    if (static_cast<double>(one.values) * kMargin < static_cast<double>(figure.values))
      WARN(figure.name << ": " << one.values << " values, well below the committed "
                       << figure.values << ": update the figure (see the top of this file)");
  }
}

}  // namespace
}  // namespace remat
