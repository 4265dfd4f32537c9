#include "remat/report.h"

#include <catch2/catch.hpp>
#include <cctype>
#include <map>
#include <string>

#include "remat/solver.h"
#include "solver/test_chains.h"
#include "xml.h"

using remat::test::parse_xml;

namespace {

std::int64_t as_int(const std::string& text) { return std::stoll(text); }

}  // namespace

TEST_CASE("the XML reader rejects malformed documents", "[report]") {
  CHECK_NOTHROW(parse_xml("<a x=\"1\"><b/>t &amp; u</a>"));
  CHECK_THROWS(parse_xml("<a><b></a>"));
  CHECK_THROWS(parse_xml("<a x=1/>"));
  CHECK_THROWS(parse_xml("<a>1 < 2</a>"));
  CHECK_THROWS(parse_xml("<a>&nbsp;</a>"));
  CHECK_THROWS(parse_xml("<a x=\"1\" x=\"2\"/>"));
  CHECK_THROWS(parse_xml("<a/><b/>"));
}

TEST_CASE("schedule plot: one mark per operation, budget and peak as solved", "[report]") {
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    remat::Chain chain = remat::test::random_chain(seed);
    chain.name = "chain <" + std::to_string(seed) + "> & \"quotes\"";  // must be escaped
    const std::int64_t budget = remat::store_all_peak(chain) * 2 / 3 + 1;
    const remat::Solution s = remat::solve(chain, remat::SolveOptions(budget));
    if (!s.ok()) continue;
    INFO("seed " << seed);
    const auto svg = parse_xml(remat::schedule_svg(chain, s));
    CHECK(svg->name == "svg");
    CHECK(svg->attr("width") == "1200");
    CHECK(as_int(svg->attr("data-peak-bytes")) == s.peak_bytes);
    CHECK(as_int(svg->attr("data-ops")) == static_cast<std::int64_t>(s.sequence.size()));
    const auto ops = svg->find_all("rect", "op");
    REQUIRE(ops.size() == s.sequence.size());
    for (std::size_t k = 0; k < ops.size(); ++k)
      CHECK(ops[k]->attr("data-op") == s.sequence[k].str());
    const auto budget_lines = svg->find_all("line", "budget");
    REQUIRE(budget_lines.size() == 1);
    CHECK(as_int(budget_lines[0]->attr("data-bytes")) == budget);
    const auto peaks = svg->find_all("circle", "peak");
    REQUIRE(peaks.size() == 1);
    CHECK(as_int(peaks[0]->attr("data-bytes")) == s.peak_bytes);
    CHECK(peaks[0]->attr("data-op") ==
          s.sequence[static_cast<std::size_t>(s.simulation.peak_op)].str());
    // The peak is drawn no higher than the budget line (SVG y grows downwards).
    CHECK(std::stod(peaks[0]->attr("cy")) >= std::stod(budget_lines[0]->attr("y1")) - 0.01);
    // The title keeps the name, escaped in the file and intact once parsed.
    std::vector<const remat::test::XmlElement*> texts = svg->find_all("text");
    bool titled = false;
    for (const auto* t : texts) titled = titled || t->text == chain.name;
    CHECK(titled);
  }
}

TEST_CASE("schedule plot: long schedules are aggregated, every operation still counted",
          "[report]") {
  const remat::Chain chain = remat::test::uniform_chain(300, 10);
  const remat::Solution s =
      remat::solve(chain, remat::SolveOptions(remat::store_all_peak(chain) / 4));
  REQUIRE(s.ok());
  REQUIRE(s.sequence.size() > 800);
  const auto svg = parse_xml(remat::schedule_svg(chain, s, remat::PlotOptions().max_op_marks(200)));
  const auto marks = svg->find_all("rect", "op");
  CHECK(marks.size() <= 200);
  CHECK(as_int(svg->attr("data-op-marks")) == static_cast<std::int64_t>(marks.size()));
  std::int64_t counted = 0;
  for (const auto* m : marks) counted += as_int(m->attr("data-count"));
  CHECK(counted == static_cast<std::int64_t>(s.sequence.size()));
}

TEST_CASE("schedule plot of an infeasible solution is an error", "[report]") {
  const remat::Chain chain = remat::test::uniform_chain(5, 10);
  const remat::Solution s = remat::solve(chain, remat::SolveOptions(1));
  REQUIRE_FALSE(s.ok());
  CHECK_THROWS_WITH(remat::schedule_svg(chain, s), Catch::Contains("infeasible"));
}

TEST_CASE("tradeoff plot: every point where the tradeoff puts it", "[report]") {
  const remat::Chain chain = remat::test::random_chain(7, {8, 12});
  const remat::Tradeoff t = remat::tradeoff(chain, remat::TradeoffOptions().points(10));
  const auto svg = parse_xml(remat::tradeoff_svg(chain, t));
  CHECK(as_int(svg->attr("data-store-all-peak-bytes")) == t.store_all_peak_bytes);
  std::vector<const remat::test::XmlElement*> curves = svg->find_all("g", "curve");
  REQUIRE(curves.size() == 3);
  for (const auto* curve : curves) {
    const std::string algorithm = curve->attr("data-algorithm");
    const std::vector<remat::TradeoffPoint>& points = algorithm == "optimal"   ? t.optimal
                                                      : algorithm == "revolve" ? t.revolve
                                                                               : t.periodic_best;
    std::vector<const remat::TradeoffPoint*> feasible;
    for (const auto& p : points)
      if (p.feasible) feasible.push_back(&p);
    std::vector<const remat::test::XmlElement*> dots;
    curve->collect([](const remat::test::XmlElement& e) { return e.attr("class") == "point"; },
                   dots);
    REQUIRE(dots.size() == feasible.size());
    for (std::size_t k = 0; k < dots.size(); ++k) {
      CHECK(as_int(dots[k]->attr("data-budget-bytes")) == feasible[k]->budget_bytes);
      CHECK(std::stod(dots[k]->attr("data-makespan-ms")) ==
            Approx(feasible[k]->makespan_ms).epsilon(1e-3));
    }
  }
  CHECK(svg->find_all("circle", "store-all").size() == 1);
}

TEST_CASE("tradeoff plot: a point far above the scale is drawn at its top edge, marked",
          "[report]") {
  const remat::Chain chain = remat::test::random_chain(7, {8, 12});
  remat::Tradeoff t = remat::tradeoff(chain, remat::TradeoffOptions().points(10));
  // revolve 100 times slower at its first feasible budget: above the scale, which stops at
  // twice the optimal curve's overhead.
  remat::TradeoffPoint* slow = nullptr;
  for (auto& p : t.revolve)
    if (p.feasible && slow == nullptr) slow = &p;
  REQUIRE(slow != nullptr);
  slow->makespan_ms *= 100;
  const auto svg = parse_xml(remat::tradeoff_svg(chain, t));
  const double height = std::stod(svg->attr("height"));
  std::vector<const remat::test::XmlElement*> points;
  svg->collect([](const remat::test::XmlElement& e) { return e.attr("class") == "point"; }, points);
  int off_scale = 0;
  for (const auto* point : points) {
    INFO(point->name << " at budget " << point->attr("data-budget-bytes"));
    if (point->name == "circle") {
      const double cy = std::stod(point->attr("cy"));
      CHECK((cy > 0 && cy < height));
      CHECK(point->attr("data-off-scale").empty());
    } else {  // the marker of an off-scale point: a caret whose apex is inside the picture
      REQUIRE(point->name == "polyline");
      CHECK(point->attr("data-off-scale") == "1");
      CHECK(std::stod(point->attr("data-makespan-ms")) == Approx(slow->makespan_ms).epsilon(1e-3));
      ++off_scale;
    }
  }
  CHECK(off_scale == 1);
}

TEST_CASE("profile plot: one bar per stage, binned beyond the width", "[report]") {
  const remat::Chain small = remat::test::uniform_chain(20, 10);
  auto svg = parse_xml(remat::profile_svg(small));
  CHECK(svg->find_all("rect", "fwd").size() == 20);
  CHECK(svg->find_all("rect", "saved").size() == 20);
  const remat::Chain large = remat::test::uniform_chain(1000, 10);
  svg = parse_xml(remat::profile_svg(large));
  const auto bars = svg->find_all("rect", "bwd");
  CHECK(bars.size() < 1000);
  CHECK(as_int(svg->attr("data-bins")) == static_cast<std::int64_t>(bars.size()));
  CHECK(as_int(svg->attr("data-stages")) == 1000);
}

TEST_CASE("measurement plot: one point per measurement, placed by its bytes and value",
          "[report]") {
  remat::MeasurementPlot plot("resnet50 b32 <cuda> & co: throughput", "images per second");
  plot.series.push_back(
      {"remat optimal", {{2e9, 900, "100%"}, {1e9, 850, "50%"}, {5e8, 700, "25%"}}, true});
  plot.series.push_back({"checkpoint_sequential", {{1.5e9, 600, "K=2"}, {9e8, 500, "K=4"}}, false});
  plot.series.push_back({"plain", {{2.1e9, 910, ""}}, false});
  const auto svg = parse_xml(remat::measurement_svg(plot));
  CHECK(svg->attr("data-kind") == "measurements");
  CHECK(svg->attr("data-series") == "3");
  const auto points = svg->find_all("circle", "point");
  REQUIRE(points.size() == 6);
  // Drawn positions: more bytes further right, a larger value higher up (smaller y).
  std::map<std::string, std::pair<double, double>> at;  // "series:bytes" -> (cx, cy)
  for (const auto* p : points)
    at[p->attr("data-series") + ":" + p->attr("data-bytes")] = {std::stod(p->attr("cx")),
                                                                std::stod(p->attr("cy"))};
  CHECK(at.at("remat optimal:500000000").first < at.at("checkpoint_sequential:900000000").first);
  CHECK(at.at("checkpoint_sequential:900000000").first < at.at("remat optimal:1000000000").first);
  CHECK(at.at("remat optimal:2000000000").first < at.at("plain:2100000000").first);
  CHECK(at.at("plain:2100000000").second < at.at("remat optimal:1000000000").second);
  CHECK(at.at("remat optimal:1000000000").second <
        at.at("checkpoint_sequential:1500000000").second);
  // The connected series is one line through its points in order of bytes.
  CHECK(svg->find_all("polyline").size() == 1);
  CHECK_THROWS_AS(remat::measurement_svg(remat::MeasurementPlot("empty", "x")),
                  std::invalid_argument);
}
