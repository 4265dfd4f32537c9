#pragma once
// A small chain of `length` stages, each keeping its whole output (100 bytes out, 200 saved),
// 1 ms forward and 2 ms backward: what the package programs solve.
#include <remat/solver.h>

#include <string>

inline remat::Chain small_chain(const std::string& name, int length) {
  remat::Chain chain;
  chain.name = name;
  chain.set_input(100);
  for (int i = 0; i < length; ++i) {
    remat::Stage stage = remat::Stage::keeping_all("s" + std::to_string(i), 100, 200);
    stage.fwd_ms = 1;
    stage.bwd_ms = 2;
    chain.stages.push_back(stage);
  }
  return chain;
}
