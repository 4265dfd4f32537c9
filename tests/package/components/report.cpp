// remat::report alone: a schedule's picture.
#include <remat/report.h>

#include <iostream>

#include "../small_chain.h"

int main() {
  const remat::Chain chain = small_chain("report", 6);
  const remat::Solution s = remat::solve(chain, remat::SolveOptions(remat::store_all_peak(chain) / 2));
  const std::string svg = remat::schedule_svg(chain, s);
  std::cout << "report: " << svg.size() << " bytes of SVG\n";
  return s.ok() && svg.find("<svg") != std::string::npos && svg.find("</svg>") != std::string::npos ? 0 : 1;
}
