// Solves a small chain through the installed remat::solver; exits 0 when the schedule fits.
#include <remat/solver.h>

#include <iostream>

int main() {
  remat::Chain chain;
  chain.name = "consumer";
  chain.set_input(100);
  for (int i = 0; i < 8; ++i) {
    remat::Stage stage = remat::Stage::keeping_all("s" + std::to_string(i), 100, 200);
    stage.fwd_ms = 1;
    stage.bwd_ms = 2;
    chain.stages.push_back(stage);
  }
  const auto solution = remat::solve(chain, remat::SolveOptions(remat::parse_size("1000")));
  std::cout << remat::collapsed_string(solution.sequence) << "\n";
  return solution.ok() && solution.peak_bytes <= 1000 ? 0 : 1;
}
