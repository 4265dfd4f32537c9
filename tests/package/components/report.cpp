// remat::report alone: a schedule's picture.
#include <remat/report.h>

#include <iostream>

int main() {
  remat::Chain chain;
  chain.name = "report";
  chain.set_input(100);
  for (int i = 0; i < 6; ++i) {
    remat::Stage stage = remat::Stage::keeping_all("s" + std::to_string(i), 100, 200);
    stage.fwd_ms = 1;
    stage.bwd_ms = 2;
    chain.stages.push_back(stage);
  }
  const remat::Solution s = remat::solve(chain, remat::SolveOptions(remat::store_all_peak(chain) / 2));
  const std::string svg = remat::schedule_svg(chain, s);
  std::cout << "report: " << svg.size() << " bytes of SVG\n";
  return s.ok() && svg.find("<svg") != std::string::npos && svg.find("</svg>") != std::string::npos ? 0 : 1;
}
