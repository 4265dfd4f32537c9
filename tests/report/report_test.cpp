#include "remat/report.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cctype>
#include <functional>
#include <map>
#include <string>
#include <tuple>

#include "remat/solver.h"
#include "solver/test_chains.h"
#include "xml.h"

using remat::test::parse_xml;

namespace {

using remat::test::XmlElement;

std::int64_t as_int(const std::string& text) { return std::stoll(text); }
double as_double(const std::string& text) { return std::stod(text); }

/// A linear axis as the picture draws it: pixel = slope * value + offset.
struct DrawnAxis {
  double slope = 0, offset = 0;
  double at(double value) const { return slope * value + offset; }
  double value(double pixel) const { return (pixel - offset) / slope; }
};

/// A tick label read back: "1.5 MiB" -> 1572864, "20 ms" -> 20, "900" -> 900.
double tick_value(const std::string& label) {
  std::size_t used = 0;
  const double number = std::stod(label, &used);
  std::string unit = label.substr(used);
  unit.erase(0, unit.find_first_not_of(' '));
  const std::map<std::string, double> units = {
      {"", 1}, {"ms", 1}, {"B", 1}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  REQUIRE(units.count(unit) == 1);
  return number * units.at(unit);
}

/// The axes drawn with tick labels of class `cls` ("x-tick" or "y-tick"), from the labels'
/// values and the positions of the lines drawn with them, in the order drawn (the profile plot
/// has two y axes), independently of the plots' own scale code. Every tick must lie on its
/// axis's line.
std::vector<DrawnAxis> drawn_axes(const XmlElement& root, const std::string& cls) {
  std::vector<std::vector<std::pair<double, double>>> runs;  // (value, pixel) per axis
  std::function<void(const XmlElement&)> walk = [&](const XmlElement& e) {
    std::ptrdiff_t last_tick = -10;
    for (std::size_t k = 0; k < e.children.size(); ++k) {
      const XmlElement& child = *e.children[k];
      if (child.name == "text" && child.attr("class") == cls) {
        REQUIRE(k > 0);
        const XmlElement& line = *e.children[k - 1];
        REQUIRE(line.name == "line");
        const double pixel = as_double(line.attr(cls == "x-tick" ? "x1" : "y1"));
        // A new axis unless the previous tick was drawn just before (line, [line,] text).
        if (static_cast<std::ptrdiff_t>(k) - last_tick > 3) runs.emplace_back();
        runs.back().emplace_back(tick_value(child.text), pixel);
        last_tick = static_cast<std::ptrdiff_t>(k);
      }
      walk(child);
    }
  };
  walk(root);
  std::vector<DrawnAxis> axes;
  for (const auto& ticks : runs) {
    REQUIRE(ticks.size() >= 2);
    const auto& [v0, p0] = ticks.front();
    const auto& [v1, p1] = ticks.back();
    DrawnAxis axis;
    axis.slope = (p1 - p0) / (v1 - v0);
    axis.offset = p0 - axis.slope * v0;
    for (const auto& [v, p] : ticks) CHECK(axis.at(v) == Approx(p).margin(0.02));
    axes.push_back(axis);
  }
  return axes;
}

DrawnAxis the_axis(const XmlElement& root, const std::string& cls) {
  const auto axes = drawn_axes(root, cls);
  REQUIRE(axes.size() == 1);
  return axes[0];
}

// Coordinates are written with two decimals.
constexpr double kPixel = 0.02;

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

TEST_CASE("schedule plot: an offloading schedule's copies have a lane of their own",
          "[report][offload]") {
  remat::Chain chain = remat::test::uniform_chain(8, 1000, 1, 2, 1000);
  chain.name = "eight";
  chain.link = remat::Link{10, 10, 0.01};
  const std::int64_t budget = remat::store_all_peak(chain) / 2;
  const remat::Solution offloading = remat::solve(chain, remat::SolveOptions(budget).offload(true));
  REQUIRE(offloading.simulation.offloads > 0);
  const auto svg = parse_xml(remat::schedule_svg(chain, offloading));
  // Two copies per offload, each where the simulation runs it on its engine; O above, P below.
  const auto copies = svg->find_all("rect", "copy");
  REQUIRE(copies.size() == 2 * static_cast<std::size_t>(offloading.simulation.offloads));
  CHECK(as_int(svg->attr("data-copies")) == 2 * offloading.simulation.offloads);
  std::size_t next = 0;
  double out_y = -1, back_y = -1;
  for (const remat::OpRecord& record : offloading.simulation.trace) {
    if (record.op.kind != remat::OpKind::kOffload && record.op.kind != remat::OpKind::kPrefetch)
      continue;
    const auto* rect = copies[next++];
    CHECK(rect->attr("data-op") == record.op.str());
    (record.op.kind == remat::OpKind::kOffload ? out_y : back_y) = std::stod(rect->attr("y"));
  }
  CHECK(out_y >= 0);
  CHECK(back_y > out_y);
  // The timeline holds the compute operations only; the memory plot starts below the lane.
  CHECK(svg->find_all("rect", "op").size() ==
        offloading.sequence.size() - 3 * static_cast<std::size_t>(offloading.simulation.offloads));
  // Without copies, no lane and the picture's geometry as before.
  const remat::Solution recomputing = remat::solve(chain, remat::SolveOptions(budget));
  const auto plain = parse_xml(remat::schedule_svg(chain, recomputing));
  CHECK(plain->find_all("rect", "copy").empty());
  CHECK(plain->attr("data-copies").empty());
  CHECK(std::stod(svg->attr("height")) == std::stod(plain->attr("height")) + 22);
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

namespace {

/// A chain named as remat names the stages of a captured model: "index:first..last module".
remat::Chain named_chain(const std::vector<std::string>& labels) {
  remat::Chain chain = remat::test::uniform_chain(static_cast<int>(labels.size()), 1024);
  for (std::size_t i = 0; i < labels.size(); ++i)
    chain.stages[i].name = std::to_string(i) + ":" + labels[i];
  return chain;
}

/// The module band's spans as (module, first, last), in the order drawn.
std::vector<std::tuple<std::string, int, int>> module_spans(const XmlElement& svg) {
  std::vector<std::tuple<std::string, int, int>> spans;
  for (const XmlElement* span : svg.find_all("rect", "module"))
    spans.emplace_back(span->attr("data-module"), std::stoi(span->attr("data-first")),
                       std::stoi(span->attr("data-last")));
  return spans;
}

std::vector<std::string> texts(const XmlElement& svg, const std::string& element,
                               const std::string& cls) {
  std::vector<std::string> out;
  for (const XmlElement* e : svg.find_all(element, cls)) out.push_back(e->text);
  return out;
}

}  // namespace

TEST_CASE("profile plot: where a model was cut, its stages grouped by module", "[report]") {
  using Spans = std::vector<std::tuple<std::string, int, int>>;
  SECTION("a ResNet: the deepest level of modules that fits, each stage in one span") {
    // A stem, 4 layers of 3 blocks of 3 stages, a head: 7 groups at the top level, 15
    // blocks, 39 stages.
    std::vector<std::string> labels = {"conv1", "bn1..relu"};
    for (int layer = 1; layer <= 4; ++layer) {
      for (int block = 0; block < 3; ++block) {
        const std::string b = "layer" + std::to_string(layer) + "." + std::to_string(block);
        labels.push_back(b + ".conv1.." + b + ".relu");
        labels.push_back(b + ".conv2.." + b + ".relu");
        labels.push_back(b + ".conv3..add");
      }
    }
    labels.push_back("fc");
    const remat::Chain chain = named_chain(labels);
    Spans blocks = {{"conv1", 0, 0}, {"bn1", 1, 1}};
    for (int k = 0; k < 12; ++k)
      blocks.emplace_back("layer" + std::to_string(1 + k / 3) + "." + std::to_string(k % 3),
                          2 + 3 * k, 4 + 3 * k);
    blocks.emplace_back("fc", 38, 38);
    // A group per 30 px at most: 600 px (15 groups) and 1200 px (35) show the blocks, not the
    // stages (39).
    for (const int width : {600, 1200}) {
      INFO(width << " px");
      const auto svg = parse_xml(remat::profile_svg(chain, remat::PlotOptions().width(width)));
      CHECK(module_spans(*svg) == blocks);
      // Each span says its module and stages on hover.
      const auto spans = svg->find_all("rect", "module");
      REQUIRE(spans[2]->children.size() == 1);
      CHECK(spans[2]->children[0]->name == "title");
      CHECK(spans[2]->children[0]->text == "layer1.0: stages 2-4");
      // Labelled as far as they fit: at 600 px a block's span is 37 px wide (5 characters:
      // "layer2.0" is labelled "0") and a stage's 12 px (1: none); at 1200 px 83 px (13) and
      // 28 px (3: "bn1" and "fc", not "conv1", which would be "c..").
      std::vector<std::string> shown;
      if (width == 1200) shown.push_back("bn1");
      for (int k = 0; k < 12; ++k)
        shown.push_back(width == 600 ? std::to_string(k % 3)
                                     : std::get<0>(blocks[static_cast<std::size_t>(2 + k)]));
      if (width == 1200) shown.push_back("fc");
      CHECK(texts(*svg, "text", "module-label") == shown);
    }
    // 1600 px: room for each stage's own group.
    const auto wide = parse_xml(remat::profile_svg(chain, remat::PlotOptions().width(1600)));
    const Spans stages = module_spans(*wide);
    REQUIRE(stages.size() == 39);
    CHECK(stages[2] == std::make_tuple(std::string("layer1.0.conv1"), 2, 2));
  }
  SECTION("a GPT-2: its blocks, labelled by the last parts of their names that fit") {
    std::vector<std::string> labels = {"transformer.wte..transformer.drop"};
    for (int b = 0; b < 12; ++b) {
      const std::string h = "transformer.h." + std::to_string(b);
      for (const std::string& part : std::vector<std::string>{
               ".ln_1.." + h + ".attn.c_attn", ".attn", ".attn.c_proj.." + h + ".ln_2",
               ".mlp.c_fc.." + h + ".mlp.act", ".mlp.c_proj"})
        labels.push_back(h + part);
    }
    labels.push_back("transformer.ln_f..lm_head");
    const auto svg = parse_xml(remat::profile_svg(named_chain(labels)));
    Spans expected = {{"transformer.wte", 0, 0}};
    std::vector<std::string> shown = {"wte"};
    for (int b = 0; b < 12; ++b) {
      expected.emplace_back("transformer.h." + std::to_string(b), 1 + 5 * b, 5 + 5 * b);
      shown.push_back("h." + std::to_string(b));
    }
    expected.emplace_back("transformer.ln_f", 61, 61);
    shown.push_back("ln_f");
    CHECK(module_spans(*svg) == expected);
    // A block's span (5 stages, 87 px) has room for 13 characters: "transformer.h.0" is
    // labelled "h.0"; a one-stage span (17 px) for two, too few to be read: "wte" and "ln_f"
    // are not labelled (their spans say it on hover).
    shown.erase(shown.begin());
    shown.pop_back();
    CHECK(texts(*svg, "text", "module-label") == shown);
  }
  SECTION("the spans cover the stages in order, also where stages are binned") {
    std::vector<std::string> labels;
    for (int i = 0; i < 1000; ++i)
      labels.push_back("layer" + std::to_string(i / 100) + "." + std::to_string(i));
    const auto svg = parse_xml(remat::profile_svg(named_chain(labels)));
    const Spans spans = module_spans(*svg);
    REQUIRE(spans.size() == 10);  // layers: 1000 groups of one stage do not fit
    int next = 0;
    for (const auto& [module, first, last] : spans) {
      CHECK(module == "layer" + std::to_string(next / 100));
      CHECK(first == next);
      next = last + 1;
    }
    CHECK(next == 1000);
  }
  SECTION("no band where no stage is named, nor where every stage's own name is its group") {
    remat::Chain chain = remat::test::uniform_chain(12);
    for (remat::Stage& stage : chain.stages) stage.name.clear();
    CHECK(module_spans(*parse_xml(remat::profile_svg(chain))).empty());
    CHECK(module_spans(*parse_xml(remat::profile_svg(remat::test::uniform_chain(1000)))).empty());
    // A few stages named each its own: labelled, one span each.
    CHECK(module_spans(*parse_xml(remat::profile_svg(remat::test::uniform_chain(5)))).size() == 5);
  }
}

TEST_CASE("profile plot: each bar says its stage, its values and what it keeps on hover",
          "[report]") {
  remat::Chain chain = named_chain({"conv1", "layer1.0.conv1..layer1.0.relu", "fc"});
  // Stage 1 keeps its input (1 KiB), its output (1 KiB, model v1) and 2 KiB of state.
  chain.stages[1].state_bytes = 2048;
  chain.stages[1].fwd_ms = 0.25;
  chain.stages[1].bwd_ms = 0.5;
  const auto svg = parse_xml(remat::profile_svg(chain));
  const auto title = [&](const std::string& cls, std::size_t k) {
    const auto bars = svg->find_all("rect", cls);
    REQUIRE(bars.size() == 3);
    REQUIRE(bars[k]->children.size() == 1);
    return bars[k]->children[0]->text;
  };
  CHECK(title("fwd", 1) ==
        "stage 1 (layer1.0.conv1..layer1.0.relu): forward 0.25 ms, backward 0.5 ms");
  CHECK(title("bwd", 1) == title("fwd", 1));
  CHECK(title("saved", 1) ==
        "stage 1 (layer1.0.conv1..layer1.0.relu): keeps 4.00 KiB for its backward (of its input "
        "1.00 KiB, of its output 1.00 KiB, its own state 2.00 KiB); output 1.00 KiB");
  // Binned: the range and the largest values.
  const auto binned = parse_xml(remat::profile_svg(remat::test::uniform_chain(1000)));
  const auto bars = binned->find_all("rect", "fwd");
  REQUIRE(bars[0]->children.size() == 1);
  CHECK_THAT(bars[0]->children[0]->text,
             Catch::StartsWith("stages 0-2 (s0 .. s2), the largest: forward 1 ms"));
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

TEST_CASE("schedule plot geometry: marks, budget line and peak where the axes put them",
          "[report]") {
  int checked = 0;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    const remat::Chain chain = remat::test::random_chain(seed, {6, 14});
    const std::int64_t budget = remat::store_all_peak(chain) * 3 / 5;
    const remat::Solution s = remat::solve(chain, remat::SolveOptions(budget));
    if (!s.ok()) continue;
    ++checked;
    INFO("seed " << seed);
    // Every operation its own mark, and aggregated into at most 7 marks.
    for (const int max_marks : {1000, 7}) {
      INFO("at most " << max_marks << " marks");
      const auto svg =
          parse_xml(remat::schedule_svg(chain, s, remat::PlotOptions().max_op_marks(max_marks)));
      const DrawnAxis x = the_axis(*svg, "x-tick");  // time
      const DrawnAxis y = the_axis(*svg, "y-tick");  // bytes
      const auto& trace = s.simulation.trace;
      // Each mark spans its operations' times (at least a pixel wide).
      std::size_t k = 0;
      for (const auto* mark : svg->find_all("rect", "op")) {
        const auto count = static_cast<std::size_t>(as_int(mark->attr("data-count")));
        REQUIRE(k + count <= trace.size());
        const double left = x.at(trace[k].start_ms), right = x.at(trace[k + count - 1].end_ms);
        CHECK(as_double(mark->attr("x")) == Approx(left).margin(kPixel));
        CHECK(as_double(mark->attr("x")) + as_double(mark->attr("width")) ==
              Approx(std::max(right, left + 1)).margin(2 * kPixel));
        k += count;
      }
      CHECK(k == trace.size());
      // The budget line at the budget, the peak marker at the peak, over its operation.
      const auto budget_lines = svg->find_all("line", "budget");
      REQUIRE(budget_lines.size() == 1);
      CHECK(as_double(budget_lines[0]->attr("y1")) ==
            Approx(y.at(static_cast<double>(budget))).margin(kPixel));
      CHECK(as_double(budget_lines[0]->attr("y2")) == as_double(budget_lines[0]->attr("y1")));
      const auto peaks = svg->find_all("circle", "peak");
      REQUIRE(peaks.size() == 1);
      CHECK(as_double(peaks[0]->attr("cy")) ==
            Approx(y.at(static_cast<double>(s.simulation.peak_bytes))).margin(kPixel));
      const auto& peak_op = trace[static_cast<std::size_t>(s.simulation.peak_op)];
      const double cx = as_double(peaks[0]->attr("cx"));
      CHECK(cx >= x.at(peak_op.start_ms) - kPixel);
      CHECK(cx <= std::max(x.at(peak_op.end_ms), x.at(peak_op.start_ms) + 1) + kPixel);
      // The memory drawn reaches the peak and no higher: the top of the tallest stack.
      double top = 1e300;
      for (const auto* group : svg->find_all("g", "memory"))
        for (const auto& area : group->children) top = std::min(top, as_double(area->attr("y")));
      CHECK(top == Approx(y.at(static_cast<double>(s.simulation.peak_bytes))).margin(kPixel));
    }
  }
  CHECK(checked >= 20);
}

TEST_CASE("tradeoff plot geometry: each point at its budget and makespan", "[report]") {
  const remat::Chain chain = remat::test::random_chain(11, {10, 16});
  const remat::Tradeoff t = remat::tradeoff(chain, remat::TradeoffOptions().points(12));
  const auto svg = parse_xml(remat::tradeoff_svg(chain, t));
  const DrawnAxis x = the_axis(*svg, "x-tick");  // budget
  const DrawnAxis y = the_axis(*svg, "y-tick");  // makespan
  int drawn = 0, off_scale = 0;
  for (const auto* curve : svg->find_all("g", "curve")) {
    const std::string algorithm = curve->attr("data-algorithm");
    const auto& points = algorithm == "optimal"   ? t.optimal
                         : algorithm == "revolve" ? t.revolve
                                                  : t.periodic_best;
    std::vector<const XmlElement*> dots;
    curve->collect([](const XmlElement& e) { return e.attr("class") == "point"; }, dots);
    std::size_t k = 0;
    for (const auto& p : points) {
      if (!p.feasible) continue;
      REQUIRE(k < dots.size());
      INFO(algorithm << " at " << p.budget_bytes);
      const double px = x.at(static_cast<double>(p.budget_bytes));
      if (dots[k]->name == "circle") {
        CHECK(as_double(dots[k]->attr("cx")) == Approx(px).margin(kPixel));
        CHECK(as_double(dots[k]->attr("cy")) == Approx(y.at(p.makespan_ms)).margin(kPixel));
        ++drawn;
      } else {  // off the scale: a caret at the top edge, whose apex is below the point's value
        REQUIRE(dots[k]->name == "polyline");
        const std::string apex = dots[k]->attr("points");
        const std::size_t first = apex.find(' ') + 1, comma = apex.find(',', first);
        CHECK(std::stod(apex.substr(first, comma - first)) == Approx(px).margin(kPixel));
        CHECK(y.value(std::stod(apex.substr(comma + 1))) < p.makespan_ms);
        ++off_scale;
      }
      ++k;
    }
    CHECK(k == dots.size());
  }
  CHECK(drawn >= 20);
  INFO(off_scale << " points above the scale");
  const auto store_all = svg->find_all("circle", "store-all");
  REQUIRE(store_all.size() == 1);
  CHECK(as_double(store_all[0]->attr("cx")) ==
        Approx(x.at(static_cast<double>(t.store_all_peak_bytes))).margin(kPixel));
  CHECK(as_double(store_all[0]->attr("cy")) ==
        Approx(y.at(t.store_all_makespan_ms)).margin(kPixel));
}

TEST_CASE("profile plot geometry: bar heights are the stages' values on their axes", "[report]") {
  for (const int length : {12, 1000}) {
    INFO(length << " stages");
    const remat::Chain chain = remat::test::random_chain(5, {length, length});
    const auto svg = parse_xml(remat::profile_svg(chain));
    const std::vector<DrawnAxis> axes = drawn_axes(*svg, "y-tick");
    REQUIRE(axes.size() == 2);  // time, then bytes
    const auto bars = [&](const std::string& cls) { return svg->find_all("rect", cls); };
    // Each bar from zero up to its value; a bin's bar is the largest of its stages, which are
    // consecutive, and every stage is in one bin.
    const auto check_panel = [&](const std::string& cls, const DrawnAxis& axis,
                                 const std::function<double(const remat::Stage&)>& value) {
      const auto drawn = bars(cls);
      REQUIRE(!drawn.empty());
      const std::size_t bins = drawn.size();
      for (std::size_t b = 0; b < bins; ++b) {
        const double top = as_double(drawn[b]->attr("y"));
        const double bottom = top + as_double(drawn[b]->attr("height"));
        CHECK(bottom == Approx(axis.at(0)).margin(kPixel));
        double largest = 0;
        for (int i = 0; i < length; ++i)
          if (static_cast<std::size_t>(static_cast<long long>(i) * static_cast<long long>(bins) /
                                       length) == b)
            largest = std::max(largest, value(chain.stages[static_cast<std::size_t>(i)]));
        INFO(cls << " bar " << b);
        CHECK(top == Approx(axis.at(largest)).margin(kPixel));
      }
    };
    check_panel("fwd", axes[0], [](const remat::Stage& st) { return st.fwd_ms; });
    check_panel("bwd", axes[0], [](const remat::Stage& st) { return st.bwd_ms; });
    check_panel("out", axes[1],
                [](const remat::Stage& st) { return static_cast<double>(st.out_bytes()); });
  }
}

TEST_CASE("measurement plot geometry: each point at its bytes and value", "[report]") {
  remat::MeasurementPlot plot("throughput", "images per second");
  plot.series.push_back(
      {"remat optimal", {{2e9, 900, "100%"}, {1e9, 850, "50%"}, {5e8, 700, "25%"}}, true});
  plot.series.push_back({"checkpoint_sequential", {{1.5e9, 600, "K=2"}, {9e8, 500, "K=4"}}, false});
  const auto svg = parse_xml(remat::measurement_svg(plot));
  const DrawnAxis x = the_axis(*svg, "x-tick");
  const DrawnAxis y = the_axis(*svg, "y-tick");
  const auto points = svg->find_all("circle", "point");
  REQUIRE(points.size() == 5);
  std::size_t k = 0;  // drawn series by series, each in order of bytes
  for (auto series : plot.series) {
    std::sort(series.points.begin(), series.points.end(),
              [](const auto& a, const auto& b) { return a.bytes < b.bytes; });
    for (const auto& p : series.points) {
      INFO(series.name << " " << p.bytes);
      CHECK(as_double(points[k]->attr("cx")) == Approx(x.at(p.bytes)).margin(kPixel));
      CHECK(as_double(points[k]->attr("cy")) == Approx(y.at(p.value)).margin(kPixel));
      ++k;
    }
  }
}

namespace {

// Where `text` breaks XML 1.0's Char production (tab, newline, CR, U+0020-U+D7FF,
// U+E000-U+FFFD, U+10000-U+10FFFF, as well-formed UTF-8), which parse_xml does not check:
// the byte offset of the first offence, or npos.
std::size_t first_non_xml_char(const std::string& text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::size_t n = 0;
    std::uint32_t code = 0;
    if (c < 0x80) {
      n = 1, code = c;
    } else if (c >= 0xc2 && c <= 0xdf) {
      n = 2, code = c & 0x1fu;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 3, code = c & 0x0fu;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 4, code = c & 0x07u;
    } else {
      return i;
    }
    if (i + n > text.size()) return i;
    for (std::size_t k = 1; k < n; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xc0) != 0x80) return i;
      code = (code << 6) | (next & 0x3fu);
    }
    const std::uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < least[n]) return i;  // overlong
    const bool allowed = code == 0x9 || code == 0xa || code == 0xd ||
                         (code >= 0x20 && code <= 0xd7ff) || (code >= 0xe000 && code <= 0xfffd) ||
                         (code >= 0x10000 && code <= 0x10ffff);
    if (!allowed) return i;
    i += n;
  }
  return std::string::npos;
}

// Well-formed XML: every character allowed, and parse_xml's structure.
void check_well_formed(const std::string& svg) {
  const std::size_t offence = first_non_xml_char(svg);
  INFO("first character XML forbids at byte "
       << offence << ": " << svg.substr(offence == std::string::npos ? 0 : offence, 12));
  CHECK(offence == std::string::npos);
  CHECK_NOTHROW(parse_xml(svg));
}

}  // namespace

TEST_CASE("the XML character check can fail", "[report]") {
  CHECK(first_non_xml_char("plain text, tab\t, newline\n, caf\xc3\xa9, \xf0\x9f\x99\x82") ==
        std::string::npos);
  CHECK(first_non_xml_char("a\x1b") == 1);
  CHECK(first_non_xml_char("ab\xef\xbf\xbe") == 2);  // U+FFFE
  CHECK(first_non_xml_char("\xef\xbf\xbf") == 0);    // U+FFFF
  CHECK(first_non_xml_char("x\xff") == 1);
  CHECK(first_non_xml_char("\xc3") == 0);          // truncated
  CHECK(first_non_xml_char("\xc0\xaf") == 0);      // overlong
  CHECK(first_non_xml_char("\xed\xa0\x80") == 0);  // a surrogate
}

TEST_CASE("every plot stays well-formed XML whatever bytes the names hold", "[report]") {
  // Control characters (ESC, BEL, NUL excluded: std::string holds it, JSON files can too),
  // U+FFFE and U+FFFF, bytes that are not UTF-8, a C1 control; and a name long enough to be
  // cut, made of two-byte characters so that a cut by bytes would split one.
  const std::string hostile = std::string("net\x1b]0;owned\x07\x1b[2J ") + '\0' +
                              " \x01\x7f \xef\xbf\xbe\xef\xbf\xbf \xff\xc3 \xed\xa0\x80 \xc2\x9b";
  std::string long_name = hostile;
  for (int k = 0; k < 200; ++k) long_name += "\xc3\xa9";  // é
  for (const std::string& name : {hostile, long_name}) {
    remat::Chain chain = remat::test::random_chain(3);
    chain.name = name;
    for (remat::Stage& stage : chain.stages) stage.name = name;
    INFO("name of " << name.size() << " bytes");
    const remat::Solution s =
        remat::solve(chain, remat::SolveOptions(remat::store_all_peak(chain)));
    REQUIRE(s.ok());
    const remat::Tradeoff t = remat::tradeoff(chain, remat::TradeoffOptions().points(5));
    remat::MeasurementPlot measured(name, name);
    measured.series.push_back({name, {{1e6, 10, name}, {2e6, 20, name}}, true});
    const std::vector<std::string> pictures = {
        remat::schedule_svg(chain, s),
        remat::tradeoff_svg(chain, t),
        remat::profile_svg(chain),
        remat::schedule_svg(chain, s, remat::PlotOptions().title(name)),
        remat::tradeoff_svg(chain, t, remat::PlotOptions().title(name)),
        remat::profile_svg(chain, remat::PlotOptions().title(name)),
        remat::measurement_svg(measured),
    };
    for (const std::string& svg : pictures) {
      check_well_formed(svg);
      CHECK_THAT(svg, !Catch::Contains("\\xc3..."));  // a title is cut between characters
      // Shown as the terminal shows it.
      CHECK_THAT(svg, Catch::Contains("net\\x1b]0;owned\\x07\\x1b[2J \\x00 \\x01\\x7f "
                                      "\\xef\\xbf\\xbe\\xef\\xbf\\xbf \\xff\\xc3 \\xed\\xa0\\x80 "
                                      "\\xc2\\x9b"));
    }
  }
}
