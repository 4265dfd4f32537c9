#pragma once
// Chains for the solver tests: small random heterogeneous chains and homogeneous ones.

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "remat/solver/chain.h"

namespace remat::test {

/// What random_chain draws from.
struct RandomChainSpec {
  int min_length = 1;
  int max_length = 6;
  std::int64_t max_bytes = 20;         // out_bytes in [1, max_bytes] (0 sometimes)
  bool temporaries = true;             // nonzero fwd/bwd/loss temporaries
  bool nograd_times = true;            // fwd_nograd_ms given (and different)
  bool integer_times = false;          // whole-millisecond times (many exact ties)
  std::int64_t max_fwd_tmp_bytes = 0;  // 0: as max_bytes
  /// Cost model v2: tuples of 1 to 3 members, members without gradient, stages that keep
  /// only some of their input and output members. Off: every stage keeps all (model v1).
  bool partial_keeps = false;
  /// With partial_keeps: stages may carry input members on unchanged.
  bool carried = false;
  /// Whether the caller keeps x_L to the step's end (Chain::output_held) one chain in four
  /// only; off: always (the default).
  bool released_outputs = true;
  /// A restart cost (Chain::restart_ms): 0 one chain in four, else up to 3 ms (whole
  /// milliseconds with integer_times). Drawn after everything else: off, the chains are those
  /// of the same seeds without it.
  bool restarts = false;
  /// Gradients of another size than their members' storages (Member::grad_bytes: an expanded
  /// member's is larger, a slice's smaller) for one member with a gradient in three, from 0 to
  /// twice max_bytes. Drawn after everything else: off, the chains are those of the same seeds
  /// without them.
  bool gradient_sizes = false;
  /// Members of x_L the loss does not differentiate (Member::loss_gradient false: a model's
  /// logits beside its own loss), for one member of x_L with a gradient in three, one chain
  /// in two, at least one differentiated member kept. Drawn after everything else: off, the
  /// chains are those of the same seeds without them.
  bool loss_members = false;
};

/// Random chains of model v2 whose stages carry members on (sizes up to 12 bytes).
inline RandomChainSpec carried_spec(int max_length) {
  RandomChainSpec spec;
  spec.max_length = max_length;
  spec.max_bytes = 12;
  spec.partial_keeps = true;
  spec.carried = true;
  spec.loss_members = true;
  return spec;
}

/// A random chain; same seed, same chain.
inline Chain random_chain(std::uint64_t seed, const RandomChainSpec& spec = {}) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  auto time = [&]() {
    if (spec.integer_times) return static_cast<double>(uniform(0, 4));
    return std::uniform_real_distribution<double>(0.1, 5.0)(rng);
  };
  Chain chain;
  chain.name = "random-" + std::to_string(seed);
  auto bytes = [&]() { return uniform(0, 7) == 0 ? 0 : uniform(1, spec.max_bytes); };
  // A random subset of 0..n-1, in increasing order.
  auto subset = [&](std::size_t n, int percent) {
    std::vector<int> out;
    for (std::size_t k = 0; k < n; ++k)
      if (uniform(0, 99) < percent) out.push_back(static_cast<int>(k));
    return out;
  };
  if (spec.partial_keeps) {
    chain.inputs.clear();
    const auto members = uniform(1, 2);
    for (std::int64_t k = 0; k < members; ++k)
      chain.inputs.push_back(Member{bytes(), uniform(0, 2) != 0});
  } else {
    chain.set_input(uniform(0, spec.max_bytes));
  }
  const int length = static_cast<int>(uniform(spec.min_length, spec.max_length));
  for (int i = 0; i < length; ++i) {
    const double fwd_ms = time(), bwd_ms = time();
    Stage stage;
    if (spec.partial_keeps) {
      const std::vector<Member>& input = chain.members(i);
      const auto fresh = uniform(1, 2);
      std::vector<bool> carried(input.size(), false);
      for (std::int64_t k = 0; k < fresh; ++k) {
        // The last stage's output needs a gradient for the loss.
        const bool grad = i + 1 == length || uniform(0, 3) != 0;
        stage.outputs.push_back(Member{bytes(), grad});
        if (spec.carried && uniform(0, 1) == 0) {
          const auto from =
              static_cast<std::size_t>(uniform(0, static_cast<std::int64_t>(input.size()) - 1));
          if (!carried[from]) {
            carried[from] = true;
            Member member = input[from];
            member.carried_from = static_cast<int>(from);
            stage.outputs.push_back(member);
          }
        }
      }
      stage.saved_inputs = subset(input.size(), 60);
      for (std::size_t k = 0; k < stage.outputs.size(); ++k)
        if (!stage.outputs[k].carried() && uniform(0, 99) < 50)
          stage.saved_outputs.push_back(static_cast<int>(k));
      stage.state_bytes = uniform(0, 2) == 0 ? 0 : uniform(0, 2 * spec.max_bytes);
    } else {
      const std::int64_t out = bytes();
      stage = Stage::keeping_all("", out,
                                 out + (uniform(0, 2) == 0 ? 0 : uniform(0, 2 * spec.max_bytes)));
    }
    stage.name = "s" + std::to_string(i);
    stage.fwd_ms = fwd_ms;
    stage.bwd_ms = bwd_ms;
    if (spec.temporaries) {
      const std::int64_t max_fwd_tmp =
          spec.max_fwd_tmp_bytes > 0 ? spec.max_fwd_tmp_bytes : spec.max_bytes;
      stage.fwd_tmp_bytes = uniform(0, 2) == 0 ? uniform(0, max_fwd_tmp) : 0;
      stage.bwd_tmp_bytes = uniform(0, 2) == 0 ? uniform(0, spec.max_bytes) : 0;
      if (spec.partial_keeps && uniform(0, 2) == 0)
        stage.fwd_nograd_tmp_bytes = uniform(0, max_fwd_tmp);
    }
    if (spec.nograd_times && uniform(0, 1) == 0) stage.fwd_nograd_ms = stage.fwd_ms * 0.5;
    chain.stages.push_back(stage);
  }
  if (spec.temporaries && uniform(0, 2) == 0) chain.loss_tmp_bytes = uniform(0, spec.max_bytes);
  if (spec.released_outputs) chain.output_held = uniform(0, 3) != 0;
  if (spec.restarts && uniform(0, 3) != 0)  // drawn last
    chain.restart_ms = spec.integer_times ? static_cast<double>(uniform(1, 3))
                                          : std::uniform_real_distribution<double>(0.0, 3.0)(rng);
  if (spec.gradient_sizes) {
    auto draw = [&](Member& member) {
      if (member.grad && uniform(0, 2) == 0) member.grad_bytes = uniform(0, 2 * spec.max_bytes);
    };
    for (Member& member : chain.inputs) draw(member);
    for (std::size_t i = 0; i < chain.stages.size(); ++i) {
      const std::vector<Member>& input = chain.members(static_cast<int>(i));
      for (Member& member : chain.stages[i].outputs) {
        if (member.carried())  // the same tensor: its gradient too
          member.grad_bytes = input[static_cast<std::size_t>(member.carried_from)].grad_bytes;
        else
          draw(member);
      }
    }
  }
  if (spec.loss_members && uniform(0, 1) == 0) {  // drawn last
    std::vector<Member>& output = chain.stages.back().outputs;
    for (Member& member : output)
      if (member.grad && uniform(0, 2) == 0) member.loss_gradient = false;
    bool any = false;
    for (const Member& member : output) any = any || (member.grad && member.loss_gradient);
    if (!any)
      for (Member& member : output)
        if (member.grad) {
          member.loss_gradient = true;
          break;
        }
  }
  return chain;
}

/// A homogeneous chain: every stage the same (what revolve assumes), keeping its input, its
/// output and `state_bytes` more for its backward (model v1).
inline Chain uniform_chain(int length, std::int64_t bytes = 10, double fwd_ms = 1.0,
                           double bwd_ms = 2.0, std::int64_t state_bytes = 0) {
  Chain chain;
  chain.name = "uniform-" + std::to_string(length);
  chain.set_input(bytes);
  for (int i = 0; i < length; ++i) {
    Stage stage = Stage::keeping_all("s" + std::to_string(i), bytes, bytes + state_bytes);
    stage.fwd_ms = fwd_ms;
    stage.bwd_ms = bwd_ms;
    chain.stages.push_back(stage);
  }
  return chain;
}

}  // namespace remat::test
