#pragma once
// Chains for the solver tests: small random heterogeneous chains and homogeneous ones.

#include <cstdint>
#include <random>
#include <string>

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
};

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
  chain.input_bytes = uniform(0, spec.max_bytes);
  const int length = static_cast<int>(uniform(spec.min_length, spec.max_length));
  for (int i = 0; i < length; ++i) {
    Stage stage;
    stage.name = "s" + std::to_string(i);
    stage.fwd_ms = time();
    stage.bwd_ms = time();
    stage.out_bytes = uniform(0, 7) == 0 ? 0 : uniform(1, spec.max_bytes);
    stage.saved_bytes = stage.out_bytes + (uniform(0, 2) == 0 ? 0 : uniform(0, 2 * spec.max_bytes));
    if (spec.temporaries) {
      const std::int64_t max_fwd_tmp =
          spec.max_fwd_tmp_bytes > 0 ? spec.max_fwd_tmp_bytes : spec.max_bytes;
      stage.fwd_tmp_bytes = uniform(0, 2) == 0 ? uniform(0, max_fwd_tmp) : 0;
      stage.bwd_tmp_bytes = uniform(0, 2) == 0 ? uniform(0, spec.max_bytes) : 0;
    }
    if (spec.nograd_times && uniform(0, 1) == 0) stage.fwd_nograd_ms = stage.fwd_ms * 0.5;
    chain.stages.push_back(stage);
  }
  if (spec.temporaries && uniform(0, 2) == 0) chain.loss_tmp_bytes = uniform(0, spec.max_bytes);
  return chain;
}

/// A homogeneous chain: every stage the same (what revolve assumes).
inline Chain uniform_chain(int length, std::int64_t bytes = 10, double fwd_ms = 1.0,
                           double bwd_ms = 2.0) {
  Chain chain;
  chain.name = "uniform-" + std::to_string(length);
  chain.input_bytes = bytes;
  for (int i = 0; i < length; ++i) {
    Stage stage;
    stage.name = "s" + std::to_string(i);
    stage.fwd_ms = fwd_ms;
    stage.bwd_ms = bwd_ms;
    stage.out_bytes = bytes;
    stage.saved_bytes = bytes;
    chain.stages.push_back(stage);
  }
  return chain;
}

}  // namespace remat::test
