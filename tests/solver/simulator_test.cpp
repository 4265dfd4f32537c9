// The simulator: a hand-computed replay, and every kind of invalid sequence.
#include <catch2/catch.hpp>

#include "remat/solver.h"
#include "test_chains.h"

namespace remat {
namespace {

// x_0 = 100 bytes, four stages of output 100 and saved 200 (output included), 1 ms forward
// (0.5 ms without autograd), 2 ms backward.
Chain four_stages() {
  Chain chain = test::uniform_chain(4, 100, 1.0, 2.0);
  for (Stage& stage : chain.stages) {
    stage.saved_bytes = 200;
    stage.fwd_nograd_ms = 0.5;
  }
  return chain;
}

std::size_t failing_op(const Chain& chain, const std::string& sequence) {
  try {
    simulate(chain, parse_sequence(sequence, chain.length()));
  } catch (const InvalidSequenceError& error) {
    return error.op_index();
  }
  return static_cast<std::size_t>(-1);
}

}  // namespace

TEST_CASE("a replay by hand: live memory after each operation", "[solver]") {
  const Chain chain = four_stages();
  const Sequence sequence =
      parse_sequence("CF_0 Fn_1 CF_2 Fe_3 L B_3 Fe_2 B_2 Fe_0..1 B_1..0", chain.length());
  const Simulation sim = simulate(chain, sequence);
  // During each operation: inputs, outputs and temporaries (none here).
  const std::vector<std::int64_t> during = {200, 300, 300, 500, 600, 700,
                                            500, 600, 400, 600, 700, 500};
  const std::vector<std::int64_t> after = {200, 200, 300, 500, 600, 300,
                                           500, 200, 400, 600, 400, 100};
  REQUIRE(sim.trace.size() == during.size());
  for (std::size_t k = 0; k < during.size(); ++k) {
    INFO("op " << k << " " << sim.trace[k].op.str());
    CHECK(sim.trace[k].during.total() == during[k]);
    CHECK(sim.trace[k].live_after_bytes == after[k]);
  }
  CHECK(sim.peak_bytes == 700);
  CHECK(sim.peak_op == 5);
  CHECK(sim.makespan_ms == Approx(0.5 * 3 + 1.0 * 4 + 2.0 * 4));
  CHECK(simulate(chain, sequence, TimeModel{false}).makespan_ms == Approx(1.0 * 7 + 2.0 * 4));
  CHECK(sim.nograd_forwards == 3);
  CHECK(sim.grad_forwards == 4);
  // The breakdown at B_3: x_0, x_2 (checkpoints) and x_3 (B_3's input), xbar_4 saved, y_4 and
  // y_3 gradients. B_0 frees x_0 too: only y_0 remains.
  const MemoryBreakdown& b3 = sim.trace[5].during;
  CHECK(b3.checkpoint_bytes == 300);
  CHECK(b3.saved_bytes == 200);
  CHECK(b3.gradient_bytes == 200);
  CHECK(b3.temporary_bytes == 0);
}

TEST_CASE("temporaries count during their operation only", "[solver]") {
  Chain chain = four_stages();
  chain.stages[1].fwd_tmp_bytes = 1000;
  chain.stages[2].bwd_tmp_bytes = 50;
  chain.loss_tmp_bytes = 7;
  const Simulation sim = simulate(chain, parse_sequence("Fe_0..3 L B_3..0", 4));
  CHECK(sim.trace[1].during.temporary_bytes == 1000);
  CHECK(sim.trace[1].during.total() == 100 + 200 + 200 + 1000);
  CHECK(sim.trace[4].during.temporary_bytes == 7);
  CHECK(sim.trace[6].during.temporary_bytes == 50);
  CHECK(sim.peak_bytes == 1500);
}

TEST_CASE("invalid sequences name the operation and the reason", "[solver]") {
  const Chain chain = four_stages();
  using Catch::Contains;
  auto message = [&](const std::string& sequence) -> std::string {
    try {
      simulate(chain, parse_sequence(sequence, chain.length()));
    } catch (const InvalidSequenceError& error) {
      return error.what();
    }
    return "(valid)";
  };
  CHECK_THAT(message("Fe_1"), Contains("operation 0 (Fe_1): its input x_1 is not in memory"));
  CHECK_THAT(message("Fe_0..3 L B_3..1"), Contains("does not end with B_0"));
  CHECK_THAT(message(""), Contains("the sequence is empty"));
  CHECK_THAT(message("Fe_0..3 L B_3..2 B_2"),
             Contains("operation 7 (B_2): gradient y_2 computed twice"));
  CHECK_THAT(message("Fe_0..3 B_3"), Contains("operation 4 (B_3): gradient y_4 is not in memory"));
  CHECK_THAT(message("Fe_0..2 L"), Contains("operation 3 (L): the output x_4 is not in memory"));
  CHECK_THAT(message("Fe_0..3 L L"), Contains("the loss was already computed"));
  CHECK_THAT(message("CF_0 Fn_1..3 L B_3"), Contains("stage 3 holds no autograd state"));
  CHECK_THAT(message("Fe_0 Fe_0"), Contains("operation 1 (Fe_0): stage 0 already holds"));
  CHECK_THAT(message("CF_0 CF_0"), Contains("operation 1 (CF_0): x_1 is already in memory"));
  CHECK_THAT(message("Fe_0..3 L B_3..0 Fe_0"),
             Contains("operation 9 (Fe_0): operations after B_0"));
  CHECK_THAT(message("Fe_0..3 L B_3 Fe_3"), Contains("stage 3 was already backpropagated"));
  CHECK_THAT(message("Fe_7"), Contains("stage 7 is outside the chain's stages 0..3"));
  // Fn frees its input: recomputing from it is then impossible.
  CHECK(failing_op(chain, "CF_0 Fn_1 Fn_2 Fe_1") == 3);
}

TEST_CASE("what frees what", "[solver]") {
  const Chain chain = four_stages();
  // A checkpoint kept by CF_1 survives a later Fn_1 ...
  CHECK_NOTHROW(simulate(
      chain, parse_sequence("CF_0 CF_1 Fn_2 Fe_3 L B_3 Fn_1 Fe_2 B_2 Fe_1 B_1 Fe_0 B_0", 4)));
  // ... while x_2 produced by Fn_1 and consumed by Fn_2 is gone.
  CHECK(failing_op(chain, "CF_0 Fn_1 Fn_2 Fe_3 L B_3 Fe_2") == 6);
  // The input x_0 belongs to the caller: Fn_0 does not free it.
  CHECK_NOTHROW(simulate(chain, parse_sequence("Fn_0 Fn_1 Fn_2 Fe_3 L B_3 Fe_0..2 B_2..0", 4)));
}

TEST_CASE("sequences print collapsed and parse back", "[solver]") {
  const Sequence sequence =
      parse_sequence("CF_0 Fn_1 Fn_2 Fn_3 Fe_4 Fe_5 L B_5 B_4 Fe_0, Fe_1 B_1 B_0", 6);
  CHECK(collapsed_string(sequence) == "CF_0 Fn_1..3 Fe_4..5 L B_5..4 Fe_0..1 B_1..0");
  CHECK(parse_sequence(collapsed_string(sequence), 6) == sequence);
  CHECK(op_strings(parse_sequence("Fe_0..1 L", 2)) ==
        std::vector<std::string>{"Fe_0", "Fe_1", "L"});
  CHECK(parse_sequence("L", 6).front().stage == 6);
  CHECK_THROWS_WITH(parse_sequence("Fx_1", 2), Catch::Contains("unknown kind 'Fx'"));
  CHECK_THROWS_WITH(parse_sequence("Fe_a", 2), Catch::Contains("expected a stage index"));
  CHECK_THROWS_WITH(parse_sequence("B_1..3", 4),
                    Catch::Contains("backwards run over decreasing stages"));
  CHECK_THROWS_WITH(parse_sequence("Fe_3..1", 4), Catch::Contains("forwards run over increasing"));
  CHECK_THROWS_WITH(parse_op("Q"), Catch::Contains("expected Fe_i, Fn_i, CF_i, L or B_i"));
}

}  // namespace remat
