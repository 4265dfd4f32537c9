// Solves a small chain through the installed remat::solver; exits 0 when the schedule fits.
#include <remat/solver.h>

#include <iostream>

#include "small_chain.h"

int main() {
  const remat::Chain chain = small_chain("consumer", 8);
  const auto solution = remat::solve(chain, remat::SolveOptions(remat::parse_size("1000")));
  std::cout << remat::collapsed_string(solution.sequence) << "\n";
  return solution.ok() && solution.peak_bytes <= 1000 ? 0 : 1;
}
