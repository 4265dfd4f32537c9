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
    stage.state_bytes = 100;
    stage.fwd_nograd_ms = 0.5;
  }
  return chain;
}

}  // namespace

TEST_CASE("a replay by hand: live memory after each operation", "[solver]") {
  Chain chain = four_stages();
  chain.output_held = false;  // the step lets x_4 go once the loss has its value
  const Sequence sequence =
      parse_sequence("CF_0 Fn_1 CF_2 Fe_3 L B_3 Fe_2 B_2 Fe_0..1 B_1..0", chain.length());
  const Simulation sim = simulate(chain, sequence);
  // During each operation: inputs, outputs and temporaries (none here).
  const std::vector<std::int64_t> during = {200, 300, 300, 500, 600, 700,
                                            500, 600, 400, 600, 700, 500};
  const std::vector<std::int64_t> after = {200, 200, 300, 500, 600, 300,
                                           500, 200, 400, 600, 400, 200};
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
  // The breakdown at B_3: x_0 and x_2 are checkpoints; stage 3 keeps its input x_3, its output
  // x_4 and 100 bytes of state; y_4 and y_3 are gradients. After B_0, x_0 (the caller's) and y_0
  // remain.
  const MemoryBreakdown& b3 = sim.trace[5].during;
  CHECK(b3.checkpoint_bytes == 200);
  CHECK(b3.saved_bytes == 300);
  CHECK(b3.gradient_bytes == 200);
  CHECK(b3.temporary_bytes == 0);

  // The caller keeps x_4 to the step's end (the default): from B_3 on it stays, 100 bytes on
  // everything after. During B_3 stage 3's state holds it too: one storage, nothing more.
  chain.output_held = true;
  const Simulation held = simulate(chain, sequence);
  const std::vector<std::int64_t> held_during = {200, 300, 300, 500, 600, 700,
                                                 600, 700, 500, 700, 800, 600};
  const std::vector<std::int64_t> held_after = {200, 200, 300, 500, 600, 400,
                                                600, 300, 500, 700, 500, 300};
  for (std::size_t k = 0; k < held_during.size(); ++k) {
    INFO("output held, op " << k << " " << held.trace[k].op.str());
    CHECK(held.trace[k].during.total() == held_during[k]);
    CHECK(held.trace[k].live_after_bytes == held_after[k]);
  }
  CHECK(held.peak_bytes == 800);
  CHECK(held.peak_op == 10);  // B_1
  CHECK(held.makespan_ms == sim.makespan_ms);
}

TEST_CASE("the caller's output stays to the step's end, and one made again is another copy",
          "[solver]") {
  Chain chain = four_stages();
  // x_4 made without autograd, given to the loss, then made again by Fe_3 for B_3: the caller
  // still holds the first copy (100 bytes) beside the new one.
  const Sequence again = parse_sequence("CF_0 Fn_1..3 L Fe_3 B_3 Fe_0..2 B_2..0", 4);
  const Simulation held = simulate(chain, again);
  chain.output_held = false;
  const Simulation released = simulate(chain, again);
  // Fe_3: x_0, x_3, y_4, the new x_4 and stage 3's state; held: the caller's x_4 too.
  CHECK(released.trace[5].during.total() == 500);
  CHECK(held.trace[5].during.total() == 600);
  for (std::size_t k = 0; k < 5; ++k)
    CHECK(held.trace[k].during.total() == released.trace[k].during.total());
  for (std::size_t k = 5; k < again.size(); ++k) {
    INFO("op " << k);
    CHECK(held.trace[k].during.total() == released.trace[k].during.total() + 100);
    CHECK(held.trace[k].live_after_bytes == released.trace[k].live_after_bytes + 100);
  }
  // The caller's copy counts as an activation value.
  CHECK(held.trace.back().during.checkpoint_bytes ==
        released.trace.back().during.checkpoint_bytes + 100);
}

TEST_CASE("a restart costs restart_ms: each forward right after a backward", "[solver]") {
  Chain chain = four_stages();
  chain.restart_ms = 0.25;
  // Two restarts: Fe_2 after B_3, Fe_0 after B_2. Fe_1 (after Fe_0) and the forwards before
  // the loss are none.
  const Sequence sequence =
      parse_sequence("CF_0 Fn_1 CF_2 Fe_3 L B_3 Fe_2 B_2 Fe_0..1 B_1..0", chain.length());
  const Simulation sim = simulate(chain, sequence);
  CHECK(sim.restarts == 2);
  CHECK(sim.makespan_ms == Approx(0.5 * 3 + 1.0 * 4 + 2.0 * 4 + 2 * 0.25));
  CHECK(sim.trace[6].end_ms - sim.trace[6].start_ms == Approx(1.25));  // Fe_2
  CHECK(sim.trace[8].end_ms - sim.trace[8].start_ms == Approx(1.25));  // Fe_0
  CHECK(sim.trace[9].end_ms - sim.trace[9].start_ms == Approx(1.0));   // Fe_1
  // Store-all has none; the time model's choice of forward times leaves restarts alone.
  CHECK(simulate(chain, parse_sequence("Fe_0..3 L B_3..0", 4)).restarts == 0);
  CHECK(simulate(chain, parse_sequence("Fe_0..3 L B_3..0", 4)).makespan_ms == Approx(12.0));
  CHECK(simulate(chain, sequence, TimeModel{false}).makespan_ms ==
        Approx(1.0 * 7 + 2.0 * 4 + 2 * 0.25));
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
  CHECK_THAT(message("Fe_0 L"), Contains("operation 1 (L): the output x_4 is not in memory"));
  CHECK_THAT(message("Fe_0..3 L B_3..0 Fe_0"),
             Contains("operation 9 (Fe_0): operations after B_0"));
  CHECK_THAT(message("Fe_0..3 L B_3 Fe_3"), Contains("stage 3 was already backpropagated"));
  CHECK_THAT(message("Fe_7"), Contains("stage 7 is outside the chain's stages 0..3"));
  // An input that no operation made.
  CHECK_THAT(message("CF_0 Fe_2"), Contains("operation 1 (Fe_2): its input x_2 is not in memory"));
}

TEST_CASE("what frees what", "[solver]") {
  const Chain chain = four_stages();
  // Values stay while a later operation reads them: x_1 from CF_0 serves Fn_1 and, later, Fe_1
  // (nothing makes x_1 again in between), so it is held across the whole first sweep.
  const Simulation kept =
      simulate(chain, parse_sequence("CF_0 Fn_1 Fn_2 Fe_3 L B_3 Fe_2 B_2 Fe_1 B_1 Fe_0 B_0", 4));
  const Simulation dropped =
      simulate(chain, parse_sequence("CF_0 Fn_1 Fn_2 Fe_3 L B_3 Fe_0 Fe_1 Fe_2 B_2 B_1 B_0", 4));
  CHECK(kept.trace[2].live_after_bytes == 400);     // x_0, x_1, x_3 and ... x_2 dropped
  CHECK(dropped.trace[2].live_after_bytes == 200);  // x_0 and x_3: x_1 is made again by Fe_0
  // The input x_0 belongs to the caller: nothing frees it.
  const Simulation input =
      simulate(chain, parse_sequence("Fn_0 Fn_1 Fn_2 Fe_3 L B_3 Fe_0..2 B_2..0", 4));
  CHECK(input.trace.back().live_after_bytes == 300);  // x_0, y_0 and the caller's x_4
}

TEST_CASE("a storage counts once, whoever holds it", "[solver]") {
  // Stage 0 keeps its output, stage 1 keeps its input: the same tensor, counted once. The mask
  // (no gradient) is carried from x_1 to x_2 by stage 1 and kept by stages 1 and 2: one
  // storage.
  Chain chain;
  chain.set_input(10, false);
  Stage a;
  a.outputs = {Member{100}, Member{4, false}};
  a.saved_outputs = {0};
  Stage b;
  b.outputs = {Member{50}, Member{4, false, 1}};  // passes the mask on
  b.saved_inputs = {0, 1};
  b.state_bytes = 7;
  Stage c;
  c.outputs = {Member{20}};
  c.saved_inputs = {1};  // keeps only the mask
  chain.stages = {a, b, c};
  chain.output_held = false;  // the caller lets x_3 go with the loss
  chain.validate();
  const Simulation sim = simulate(chain, parse_sequence("Fe_0..2 L B_2..0", 3));
  // Fe_0: x_0, x_1 = 10 + 104. Fe_1: + x_2 (50, its mask is x_1's) + 7; x_1 stays (kept by both).
  CHECK(sim.trace[0].during.total() == 114);
  CHECK(sim.trace[1].during.total() == 114 + 50 + 7);
  // Fe_2: + x_3 (20); x_2's new member (50) is dropped after: no one keeps it.
  CHECK(sim.trace[2].during.total() == 171 + 20);
  CHECK(sim.trace[2].live_after_bytes == 171 + 20 - 50);
  // L: + y_3 (20); then x_3 goes (stage 2 does not keep its output). B_2: + y_2, only the 50
  // of the differentiable member.
  CHECK(sim.trace[3].during.total() == 141 + 20);
  CHECK(sim.trace[3].live_after_bytes == 141);
  CHECK(sim.trace[4].during.total() == 141 + 50);
  // B_0: no y_0 (the input has no gradient).
  CHECK(sim.trace.back().during.gradient_bytes == 100);
  CHECK(sim.trace.back().live_after_bytes == 10);
}

TEST_CASE("a member of x_L the loss does not differentiate has no gradient", "[solver]") {
  // A language model's end: stage 0 makes the logits (100 bytes) from x_0 (10, kept); stage 1,
  // the model's own loss, carries the logits on beside the loss (4) and keeps their
  // log-softmax (100 of state); its backward makes a temporary of 100. The step's backward
  // starts from the loss alone: the logits' gradient is the one stage 1 makes, new in y_1.
  Chain chain;
  chain.set_input(10, false);
  Stage a;
  a.outputs = {Member{100}};
  a.saved_inputs = {0};
  Stage b;
  b.outputs = {Member{100, true, 0}, Member{4}};
  b.state_bytes = 100;
  b.bwd_tmp_bytes = 100;
  chain.stages = {a, b};
  chain.output_held = false;
  const Sequence sequence = parse_sequence("Fe_0..1 L B_1..0", 2);
  const Simulation passed = simulate(chain, sequence);
  chain.stages[1].outputs[0].loss_gradient = false;
  chain.validate();
  CHECK(chain.gradient_bytes(2) == 4);
  CHECK_FALSE(chain.carries_gradient(2));
  const Simulation own = simulate(chain, sequence);
  // L: x_0 10, the logits 100 (x_2's, carried), the loss 4, state 100; y_2: 104 with the
  // logits' gradient, 4 without.
  CHECK(passed.trace[2].during.total() == 10 + 104 + 100 + 104);
  CHECK(own.trace[2].during.total() == 10 + 104 + 100 + 4);
  // B_1: x_2 let go (output not held, the state does not keep it): x_0, state, y_2, y_1 (the
  // logits' gradient: passed in y_2's storage, or new) and the temporary.
  CHECK(passed.trace[3].during.total() == 10 + 100 + 104 + 100);
  CHECK(own.trace[3].during.total() == 10 + 100 + 4 + 100 + 100);
  CHECK(own.trace[3].during.gradient_bytes == 104);
  CHECK(passed.peak_bytes == 318);  // at L
  CHECK(own.peak_bytes == 314);     // at B_1
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
  CHECK_THROWS_WITH(parse_op("Q"),
                    Catch::Contains("expected Fe_i, Fn_i, CF_i, L, B_i, O_i, E_i or P_i"));
  // Copies: one at a time, never collapsed into runs.
  const Sequence copies = parse_sequence("CF_0 O_1 CF_1 E_1 Fe_2 L P_1 B_2 Fe_1 B_1 Fe_0 B_0", 3);
  CHECK(copies[1] == offload(1));
  CHECK(copies[3] == evict(1));
  CHECK(copies[6] == prefetch(1));
  CHECK(collapsed_string(copies) == "CF_0 O_1 CF_1 E_1 Fe_2 L P_1 B_2 Fe_1 B_1 Fe_0 B_0");
  CHECK(collapsed_string(parse_sequence("O_1 O_2", 3)) == "O_1 O_2");
  CHECK_THROWS_WITH(parse_sequence("O_1..2", 3), Catch::Contains("copies are written one at a time"));
  CHECK_FALSE(offload(1).is_forward());
  CHECK(prefetch(2).is_copy());
}

}  // namespace remat
