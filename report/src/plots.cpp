// The three pictures. Layout constants are in pixels for the default width of 1200.
#include "remat/report/plots.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "remat/base/text.h"
#include "remat/base/units.h"
#include "remat/solver/simulator.h"
#include "svg.h"

namespace remat {
namespace {

using detail::ByteAxis;
using detail::LegendEntry;
using detail::num;
using detail::Scale;
using detail::Svg;

constexpr double kLeft = 96, kRight = 28;

// Operation colors: forward with autograd, forward without, checkpointing forward, loss,
// backward.
const char* op_color(OpKind kind) {
  switch (kind) {
    case OpKind::kForwardGrad: return "#4e79a7";
    case OpKind::kForwardNoGrad: return "#a0cbe8";
    case OpKind::kForwardCheckpoint: return "#f28e2b";
    case OpKind::kLoss: return "#79706e";
    case OpKind::kBackward: return "#e15759";
    case OpKind::kOffload: return "#b07aa1";
    case OpKind::kEvict: return "#9c755f";
    case OpKind::kPrefetch: return "#ff9da7";
  }
  return "#000";
}
// Memory colors: checkpoints, saved activations, gradients, temporaries.
constexpr const char* kCheckpointColor = "#59a14f";
constexpr const char* kSavedColor = "#76b7b2";
constexpr const char* kGradientColor = "#edc948";
constexpr const char* kTemporaryColor = "#bab0ac";

std::string ms_label(double ms) { return num(ms) + " ms"; }

// Where a model was cut: a stage's name read as module paths. A captured model's stages are
// named "5:layer1.0.conv1..layer1.0.relu" (index, first module, last module); a chain's own
// stages "conv1", "layer1". The name without its index prefix:
std::string stage_label(const std::string& name) {
  const std::size_t colon = name.find(':');
  if (colon == std::string::npos || colon == 0) return name;
  for (std::size_t k = 0; k < colon; ++k)
    if (name[k] < '0' || name[k] > '9') return name;
  return name.substr(colon + 1);
}

// The first `depth` components of the first module path of a stage's label
// ("layer1.0.conv1..layer1.0.relu", 2 -> "layer1.0"), and how many components that path has.
std::string module_prefix(const std::string& label, int depth) {
  const std::string path = label.substr(0, label.find(".."));
  std::size_t end = 0;
  for (int d = 0; d < depth; ++d) {
    end = path.find('.', d == 0 ? 0 : end + 1);
    if (end == std::string::npos) return path;
  }
  return path.substr(0, end);
}
int module_depth(const std::string& label) {
  const std::string path = label.substr(0, label.find(".."));
  return path.empty() ? 0 : 1 + static_cast<int>(std::count(path.begin(), path.end(), '.'));
}

struct ModuleRun {
  std::string module;
  int first = 0, last = 0;  // stages
};

// Consecutive stages grouped by the module their first operation ran in, at the deepest
// level of the module tree that gives at most `max_runs` groups (the top level if none
// does): "layer1", "layer2" for a ResNet, "transformer.h.0" .. "transformer.h.11" for a
// GPT-2. Empty when no stage is named.
std::vector<ModuleRun> module_runs(const Chain& chain, int max_runs) {
  std::vector<std::string> labels;
  int deepest = 0;
  for (const Stage& stage : chain.stages) {
    labels.push_back(stage_label(stage.name));
    deepest = std::max(deepest, module_depth(labels.back()));
  }
  std::vector<ModuleRun> chosen;
  // Deeper levels only split groups further: stop at the first that gives too many.
  for (int depth = 1; depth <= deepest; ++depth) {
    std::vector<ModuleRun> runs;
    for (int i = 0; i < chain.length(); ++i) {
      std::string module = module_prefix(labels[static_cast<std::size_t>(i)], depth);
      if (!runs.empty() && runs.back().module == module)
        runs.back().last = i;
      else
        runs.push_back({std::move(module), i, i});
    }
    if (depth > 1 && static_cast<int>(runs.size()) > max_runs) break;
    chosen = std::move(runs);
  }
  return chosen;
}

// "stage 5", or "stages 5-8".
std::string stage_range(int first, int last) {
  return first == last ? "stage " + std::to_string(first)
                       : "stages " + std::to_string(first) + "-" + std::to_string(last);
}

// What a bar of the profile says on hover: the stage and its values, or, for a bin of several,
// the range and the largest values.
std::string stages_named(const Chain& chain, int first, int last) {
  const std::string a = stage_label(chain.stages[static_cast<std::size_t>(first)].name);
  const std::string b = stage_label(chain.stages[static_cast<std::size_t>(last)].name);
  if (first == last) return stage_range(first, last) + (a.empty() ? "" : " (" + a + ")");
  return stage_range(first, last) + (a.empty() && b.empty() ? "" : " (" + a + " .. " + b + ")") +
         ", the largest";
}

// `text` cut to at most `fits` bytes, the last of them `mark`, never inside a UTF-8 sequence
// (text.size() > fits >= mark's size).
std::string shortened(const std::string& text, std::size_t fits, const std::string& mark) {
  std::size_t cut = fits - mark.size();
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;
  return text.substr(0, cut) + mark;
}

// A title cut to what fits in the picture's width (about 8.5 px per bold character).
std::string fit(const std::string& text, double width) {
  const auto fits = static_cast<std::size_t>(std::max(20.0, (width - kLeft - kRight) / 8.5));
  return text.size() <= fits ? text : shortened(text, fits, "...");
}

// The chain's name as the terminal shows it (control characters as \x1b), so that fit()
// measures what is drawn.
std::string chain_label(const Chain& chain) {
  return chain.name.empty() ? "chain" : printable(chain.name);
}

std::string title_or(const PlotOptions& options, const std::string& fallback) {
  return options.title().empty() ? fallback : options.title();
}

// Where the schedule picture's parts go: the timeline's band, the memory plot's, and the time
// axis they share.
struct ScheduleLayout {
  // `copies`: the schedule offloads, and its copies get a lane of their own under the timeline.
  ScheduleLayout(const PlotOptions& options, double makespan_ms, bool copies)
      : width(std::max(600, options.width())),
        plot_w(width - kLeft - kRight),
        copies_h(copies ? 16 : 0),
        memory_top(timeline_top + timeline_h + (copies ? 6 + copies_h : 0) + 44),
        height(memory_top + memory_h + 64),
        makespan(std::max(makespan_ms, 1e-9)),
        x{0, makespan, kLeft, kLeft + plot_w} {}
  const double width;
  const double plot_w;
  const double timeline_top = 82, timeline_h = 34;
  const double copies_h;
  const double memory_top, memory_h = 330;
  const double height;
  const double makespan;
  const Scale x;
};

// The title, the line that sums up the schedule, and the operations' legend.
void schedule_header(Svg& svg, const Chain& chain, const Solution& solution,
                     const PlotOptions& options, const ScheduleLayout& layout) {
  const Simulation& sim = solution.simulation;
  svg.text(kLeft, 24, title_or(options, fit(chain_label(chain), layout.width)),
           "start", 15, "font-weight=\"bold\"");
  svg.text(kLeft, 44,
           std::string(algorithm_name(solution.algorithm)) + " schedule of " +
               counted(chain.length(), "stage") + ", budget " +
               format_bytes(solution.budget_bytes) + ": " + num(sim.makespan_ms) +
               " ms (store-all " + num(solution.store_all_makespan_ms) + " ms), peak " +
               format_bytes(sim.peak_bytes),
           "start", 12, "fill=\"#333\"");
  std::vector<LegendEntry> entries = {{op_color(OpKind::kForwardGrad), "Fe forward with autograd"},
                                      {op_color(OpKind::kForwardNoGrad), "Fn forward without"},
                                      {op_color(OpKind::kForwardCheckpoint), "CF checkpointing forward"},
                                      {op_color(OpKind::kBackward), "B backward"},
                                      {op_color(OpKind::kLoss), "L loss"}};
  if (layout.copies_h > 0) {
    entries.push_back({op_color(OpKind::kOffload), "O copy to host"});
    entries.push_back({op_color(OpKind::kPrefetch), "P copy back"});
  }
  legend(svg, kLeft, 64, entries);
}

// Timeline: one mark per operation, or per run of same-kind operations when there are more
// than max_op_marks. The number of marks drawn.
std::size_t schedule_timeline(Svg& svg, const std::vector<OpRecord>& trace, int max_op_marks,
                              const ScheduleLayout& layout) {
  const Scale& x = layout.x;
  const double timeline_top = layout.timeline_top, timeline_h = layout.timeline_h;
  const std::size_t n = trace.size();
  const std::size_t group = std::max<std::size_t>(
      1, (n + static_cast<std::size_t>(std::max(1, max_op_marks)) - 1) /
             static_cast<std::size_t>(std::max(1, max_op_marks)));
  svg.open_group("class=\"timeline\"");
  std::size_t marks = 0;
  for (std::size_t k = 0; k < n;) {
    std::size_t end = k + 1;
    while (group > 1 && end < n && end - k < group && trace[end].op.kind == trace[k].op.kind) ++end;
    const OpRecord& first = trace[k];
    const OpRecord& last = trace[end - 1];
    const double x0 = x(first.start_ms), x1 = x(last.end_ms);
    const double w = std::max(x1 - x0, 1.0);
    std::string label = first.op.str();
    if (end - k > 1) label += ".." + last.op.str();
    svg.rect(x0, timeline_top, w, timeline_h, op_color(first.op.kind),
             "class=\"op\" data-op=\"" + label + "\" data-count=\"" + std::to_string(end - k) +
                 "\" stroke=\"white\" stroke-width=\"" + (w > 3 ? "0.5" : "0") + "\"");
    if (end - k == 1 && first.op.kind != OpKind::kLoss) {
      const std::string index = std::to_string(first.op.stage);
      if (w >= 7.0 * static_cast<double>(index.size()) + 3)
        svg.text(x0 + w / 2, timeline_top + timeline_h / 2 + 4, index, "middle", 10,
                 first.op.kind == OpKind::kForwardNoGrad ? "fill=\"#1f3b57\"" : "fill=\"white\"");
    }
    ++marks;
    k = end;
  }
  svg.close_group();
  svg.text(kLeft - 8, timeline_top + timeline_h / 2 + 4, "ops", "end", 12, "fill=\"#333\"");
  return marks;
}

// The copy engines' lane, under the timeline: each copy to host memory (O_i, upper half) and
// back (P_i, lower half) from its start to its end on its engine, beside the computation. The
// number of copies drawn.
std::size_t schedule_copies(Svg& svg, const std::vector<OpRecord>& trace,
                            const ScheduleLayout& layout) {
  const double top = layout.timeline_top + layout.timeline_h + 6, h = layout.copies_h;
  svg.open_group("class=\"copies\"");
  std::size_t drawn = 0;
  for (const OpRecord& record : trace) {
    if (record.op.kind != OpKind::kOffload && record.op.kind != OpKind::kPrefetch) continue;
    const double x0 = layout.x(record.start_ms);
    const double w = std::max(layout.x(record.end_ms) - x0, 1.0);
    const bool out = record.op.kind == OpKind::kOffload;
    svg.rect(x0, top + (out ? 0 : h / 2), w, h / 2, op_color(record.op.kind),
             "class=\"copy\" data-op=\"" + record.op.str() + "\"");
    ++drawn;
  }
  svg.close_group();
  svg.text(kLeft - 8, top + h / 2 + 4, "copies", "end", 12, "fill=\"#333\"");
  return drawn;
}

// Memory: for each pixel column the operation with the largest memory in it, drawn as stacked
// areas; consecutive columns of one operation merge into one rectangle. With its axes; the
// bytes' scale.
Scale schedule_memory(Svg& svg, const Solution& solution, const ScheduleLayout& layout) {
  const Simulation& sim = solution.simulation;
  const std::vector<OpRecord>& trace = sim.trace;
  const std::size_t n = trace.size();
  const Scale& x = layout.x;
  const double plot_w = layout.plot_w, memory_top = layout.memory_top, memory_h = layout.memory_h;
  const double top_bytes = std::max<double>(
      {static_cast<double>(sim.peak_bytes), static_cast<double>(solution.budget_bytes), 1.0});
  const ByteAxis bytes_axis(top_bytes);
  const std::vector<double> yticks = bytes_axis.ticks(0, top_bytes * 1.08, 6);
  const double y_top = std::max(top_bytes * 1.08, yticks.back());
  const Scale y{0, y_top, memory_top + memory_h, memory_top};
  detail::y_axis(svg, y, kLeft, kLeft + plot_w, yticks, [&](double v) { return bytes_axis.label(v); },
                 "live memory");
  const int columns = static_cast<int>(std::ceil(plot_w));
  std::vector<std::ptrdiff_t> owner(static_cast<std::size_t>(columns), -1);
  for (std::size_t k = 0; k < n; ++k) {
    if (trace[k].op.is_copy()) continue;  // its memory is the next compute operation's too
    const int c0 = std::clamp(static_cast<int>(std::floor(x(trace[k].start_ms) - kLeft)), 0, columns - 1);
    const int c1 = std::clamp(static_cast<int>(std::ceil(x(trace[k].end_ms) - kLeft)) - 1, c0, columns - 1);
    for (int c = c0; c <= c1; ++c) {
      auto& o = owner[static_cast<std::size_t>(c)];
      if (o < 0 || trace[k].during.total() > trace[static_cast<std::size_t>(o)].during.total())
        o = static_cast<std::ptrdiff_t>(k);
    }
  }
  const std::vector<double> xticks = detail::nice_ticks(0, layout.makespan, 10);
  detail::x_axis(svg, x, memory_top + memory_h, memory_top, xticks, ms_label, "predicted time");
  svg.open_group("class=\"memory\"");
  for (int c = 0; c < columns;) {
    int end = c + 1;
    while (end < columns && owner[static_cast<std::size_t>(end)] == owner[static_cast<std::size_t>(c)]) ++end;
    const std::ptrdiff_t k = owner[static_cast<std::size_t>(c)];
    if (k >= 0) {
      const MemoryBreakdown& m = trace[static_cast<std::size_t>(k)].during;
      const double parts[] = {static_cast<double>(m.checkpoint_bytes), static_cast<double>(m.saved_bytes),
                              static_cast<double>(m.gradient_bytes), static_cast<double>(m.temporary_bytes)};
      const char* colors[] = {kCheckpointColor, kSavedColor, kGradientColor, kTemporaryColor};
      double base = 0;
      for (int p = 0; p < 4; ++p) {
        if (parts[p] <= 0) continue;
        svg.rect(kLeft + c, y(base + parts[p]), end - c, y(base) - y(base + parts[p]), colors[p]);
        base += parts[p];
      }
    }
    c = end;
  }
  svg.close_group();
  return y;
}

// The budget's line, the peak's point and label, and the memory legend.
void schedule_budget_and_peak(Svg& svg, const Solution& solution, const ScheduleLayout& layout,
                              const Scale& y) {
  const Simulation& sim = solution.simulation;
  const Scale& x = layout.x;
  const double plot_w = layout.plot_w;
  const double budget_y = y(static_cast<double>(solution.budget_bytes));
  svg.line(kLeft, budget_y, kLeft + plot_w, budget_y, "#d62728", 1.5,
           "class=\"budget\" stroke-dasharray=\"6 4\" data-bytes=\"" +
               std::to_string(solution.budget_bytes) + "\"");
  svg.text(kLeft + plot_w - 4, budget_y - 5, "budget " + format_bytes(solution.budget_bytes), "end",
           11, "fill=\"#d62728\"");
  const OpRecord& peak_op =
      sim.trace[static_cast<std::size_t>(std::max<std::ptrdiff_t>(0, sim.peak_op))];
  const double peak_x = (x(peak_op.start_ms) + std::max(x(peak_op.end_ms), x(peak_op.start_ms) + 1)) / 2;
  const double peak_y = y(static_cast<double>(sim.peak_bytes));
  svg.circle(peak_x, peak_y, 4.5, "black",
             "class=\"peak\" data-bytes=\"" + std::to_string(sim.peak_bytes) + "\" data-op=\"" +
                 peak_op.op.str() + "\"");
  const bool right_half = peak_x > kLeft + plot_w * 0.7;
  svg.text(peak_x + (right_half ? -8 : 8), peak_y - 8,
           "peak " + format_bytes(sim.peak_bytes) + " at " + peak_op.op.str(),
           right_half ? "end" : "start", 11, "font-weight=\"bold\"");
  legend(svg, kLeft, layout.height - 14,
         {{kCheckpointColor, "checkpoints (x)"},
          {kSavedColor, "saved for backward"},
          {kGradientColor, "gradients (y)"},
          {kTemporaryColor, "temporaries"},
          {"#d62728", "budget", LegendEntry::kDashed}});
}

}  // namespace

std::string schedule_svg(const Chain& chain, const Solution& solution, const PlotOptions& options) {
  if (!solution.ok() || solution.simulation.trace.empty())
    throw std::invalid_argument("schedule plot: the solution is infeasible; nothing to draw");
  const Simulation& sim = solution.simulation;
  const ScheduleLayout layout(options, sim.makespan_ms, sim.offloads > 0);
  Svg svg(layout.width, layout.height);
  svg.root_attribute("data-kind", "schedule");
  svg.root_attribute("data-ops", std::to_string(solution.sequence.size()));
  svg.root_attribute("data-makespan-ms", num(sim.makespan_ms));
  svg.root_attribute("data-peak-bytes", std::to_string(sim.peak_bytes));
  svg.root_attribute("data-budget-bytes", std::to_string(solution.budget_bytes));
  schedule_header(svg, chain, solution, options, layout);
  // The compute stream's operations: copies run on engines of their own, beside them.
  std::vector<OpRecord> compute;
  for (const OpRecord& record : sim.trace)
    if (!record.op.is_copy()) compute.push_back(record);
  const std::size_t marks = schedule_timeline(svg, compute, options.max_op_marks(), layout);
  svg.root_attribute("data-op-marks", std::to_string(marks));
  if (sim.offloads > 0)
    svg.root_attribute("data-copies", std::to_string(schedule_copies(svg, sim.trace, layout)));
  const Scale y = schedule_memory(svg, solution, layout);
  schedule_budget_and_peak(svg, solution, layout, y);
  return svg.str();
}

std::string tradeoff_svg(const Chain& chain, const Tradeoff& t, const PlotOptions& options) {
  const double width = std::max(600, options.width());
  const double plot_w = width - kLeft - kRight;
  const double top = 70, plot_h = 440;
  const double height = top + plot_h + 70;
  Svg svg(width, height);
  svg.root_attribute("data-kind", "tradeoff");
  svg.root_attribute("data-store-all-peak-bytes", std::to_string(t.store_all_peak_bytes));
  svg.root_attribute("data-store-all-ms", num(t.store_all_makespan_ms));
  svg.root_attribute("data-min-budget-bytes", std::to_string(t.min_feasible_budget_bytes));

  // Ranges: budgets of the grid and the periodic points within 1.15x of the largest.
  double bx0 = static_cast<double>(t.budgets.front()), bx1 = static_cast<double>(t.budgets.back());
  double my0 = t.store_all_makespan_ms, my1 = t.store_all_makespan_ms;
  auto extend = [&](const TradeoffPoint& p) {
    if (!p.feasible) return;
    my0 = std::min(my0, p.makespan_ms);
    my1 = std::max(my1, p.makespan_ms);
  };
  for (const TradeoffPoint& p : t.optimal) extend(p);
  for (const TradeoffPoint& p : t.offloading) extend(p);
  // The heuristics can be far slower at small budgets (revolve with 2 checkpoints on a long
  // chain: 60x store-all): the scale stops at twice the optimal curve's overhead, and points
  // above are drawn at the top edge, marked as off scale.
  const double cap = my1 + std::max(my1 - t.store_all_makespan_ms, 0.05 * t.store_all_makespan_ms);
  for (const auto* curve : {&t.revolve, &t.periodic_best})
    for (const TradeoffPoint& p : *curve)
      if (p.feasible && p.makespan_ms <= cap) extend(p);
  std::vector<const TradeoffPoint*> periodic_shown;
  for (const TradeoffPoint& p : t.periodic) {
    if (static_cast<double>(p.budget_bytes) < bx0 * 0.9 || static_cast<double>(p.budget_bytes) > bx1 * 1.15) continue;
    if (p.makespan_ms > cap) continue;
    periodic_shown.push_back(&p);
    bx0 = std::min(bx0, static_cast<double>(p.budget_bytes));
    bx1 = std::max(bx1, static_cast<double>(p.budget_bytes));
    extend(p);
  }
  const double xpad = std::max((bx1 - bx0) * 0.03, 1.0);
  const ByteAxis bytes_axis(bx1);
  const Scale x{bx0 - xpad, bx1 + xpad, kLeft, kLeft + plot_w};
  const double ypad = std::max((my1 - my0) * 0.06, 1e-6);
  const std::vector<double> yticks = detail::nice_ticks(my0 - ypad, my1 + ypad, 7);
  const Scale y{my0 - ypad, my1 + ypad, top + plot_h, top};
  std::vector<double> yshown;
  for (double v : yticks)
    if (v >= y.d0 && v <= y.d1) yshown.push_back(v);
  std::vector<double> xshown;
  for (double v : bytes_axis.ticks(x.d0, x.d1, 8))
    if (v >= x.d0 && v <= x.d1) xshown.push_back(v);
  detail::y_axis(svg, y, kLeft, kLeft + plot_w, yshown, ms_label, "predicted makespan");
  detail::x_axis(svg, x, top + plot_h, top, xshown, [&](double v) { return bytes_axis.label(v); },
                 "memory budget");
  svg.text(kLeft, 26,
           title_or(options, fit(chain_label(chain) +
                                     ": predicted time against memory budget (" +
                                     counted(chain.length(), "stage") + ")", width)),
           "start", 15, "font-weight=\"bold\"");

  // Store-all: the fastest possible time, from its peak on.
  const double sa_y = y(t.store_all_makespan_ms);
  svg.line(kLeft, sa_y, kLeft + plot_w, sa_y, "#555", 1, "stroke-dasharray=\"3 3\"");
  svg.circle(x(static_cast<double>(t.store_all_peak_bytes)), sa_y, 6, "none",
             "class=\"store-all\" stroke=\"black\" stroke-width=\"2\" data-budget-bytes=\"" +
                 std::to_string(t.store_all_peak_bytes) + "\" data-makespan-ms=\"" +
                 num(t.store_all_makespan_ms) + "\"");
  svg.text(x(static_cast<double>(t.store_all_peak_bytes)) - 8, sa_y - 10,
           "store-all " + format_bytes(t.store_all_peak_bytes) + ", " + num(t.store_all_makespan_ms) + " ms",
           "end", 11);

  // Curves: a step where the next budget starts, one marked point per grid budget.
  auto curve = [&](const std::vector<TradeoffPoint>& points, const std::string& name,
                   const std::string& color, double stroke) {
    std::vector<std::pair<double, double>> line;
    svg.open_group("class=\"curve\" data-algorithm=\"" + name + "\"");
    for (const TradeoffPoint& p : points) {
      if (!p.feasible) {
        if (line.size() > 1) svg.polyline(line, color, stroke);
        line.clear();
        continue;
      }
      const bool off_scale = p.makespan_ms > y.d1;
      const double px = x(static_cast<double>(p.budget_bytes));
      const double py = off_scale ? y.r1 : y(p.makespan_ms);
      if (!line.empty()) line.push_back({px, line.back().second});
      line.push_back({px, py});
      const std::string data = "class=\"point\" data-budget-bytes=\"" + std::to_string(p.budget_bytes) +
                               "\" data-makespan-ms=\"" + num(p.makespan_ms) + "\"";
      if (off_scale) {
        svg.polyline({{px - 5, py + 7}, {px, py}, {px + 5, py + 7}}, color, 2, data + " data-off-scale=\"1\"");
        svg.text(px + 7, py + 12, num(p.makespan_ms) + " ms", "start", 10, "fill=\"" + color + "\"");
      } else {
        svg.circle(px, py, 2.6, color, data);
      }
    }
    if (line.size() > 1) svg.polyline(line, color, stroke);
    svg.close_group();
  };
  curve(t.periodic_best, "periodic", "#f28e2b", 1.5);
  curve(t.revolve, "revolve", "#59a14f", 1.5);
  curve(t.optimal, "optimal", "#4e79a7", 2.5);
  if (!t.offloading.empty()) curve(t.offloading, "offloading", "#b07aa1", 2.5);
  svg.open_group("class=\"periodic-points\"");
  for (const TradeoffPoint* p : periodic_shown) {
    svg.circle(x(static_cast<double>(p->budget_bytes)), y(p->makespan_ms), 3.5, "white",
               "stroke=\"#f28e2b\" stroke-width=\"1.5\" data-segments=\"" + std::to_string(p->parameter) +
                   "\" data-budget-bytes=\"" + std::to_string(p->budget_bytes) +
                   "\" data-makespan-ms=\"" + num(p->makespan_ms) + "\"");
  }
  svg.close_group();
  std::vector<LegendEntry> entries = {{"#4e79a7", "optimal", LegendEntry::kLine}};
  if (!t.offloading.empty())
    entries.push_back({"#b07aa1", "optimal with offload", LegendEntry::kLine});
  entries.insert(entries.end(), {{"#59a14f", "revolve", LegendEntry::kLine},
                                 {"#f28e2b", "periodic (best segment count)", LegendEntry::kLine},
                                 {"#f28e2b", "periodic, one segment count", LegendEntry::kDot},
                                 {"#555", "store-all", LegendEntry::kDashed}});
  legend(svg, kLeft, 52, entries);
  return svg.str();
}

std::string profile_svg(const Chain& chain, const PlotOptions& options) {
  const double width = std::max(600, options.width());
  const double plot_w = width - kLeft - kRight;
  const double top1 = 70, panel_h = 230, gap = 70;
  const double top2 = top1 + panel_h + gap;
  const int length = chain.length();
  // Where the model was cut: the stages grouped by module, in a band under the stage axis.
  // Drawn where some stage is named, and where it groups stages or labels them all legibly
  // (a chain whose every stage has a name of its own, "s0" to "s999", gets no band).
  const int max_runs = std::max(1, static_cast<int>(plot_w / 30));
  const std::vector<ModuleRun> runs = module_runs(chain, max_runs);
  const bool band =
      std::any_of(runs.begin(), runs.end(), [](const ModuleRun& r) { return !r.module.empty(); }) &&
      (static_cast<int>(runs.size()) <= max_runs ||
       std::any_of(runs.begin(), runs.end(), [](const ModuleRun& r) { return r.last > r.first; }));
  const double band_top = top2 + panel_h + 50, band_h = 18;
  const double height = top2 + panel_h + 70 + (band ? band_h + 12 : 0);
  Svg svg(width, height);
  svg.root_attribute("data-kind", "profile");
  svg.root_attribute("data-stages", std::to_string(length));
  svg.text(kLeft, 26,
           title_or(options, fit(chain_label(chain) +
                                     ": per-stage profile (" + counted(length, "stage") + ")", width)),
           "start", 15, "font-weight=\"bold\"");
  // Stages are aggregated into bins when there are more than plot_w / 3 of them: a bin shows
  // the largest value of its stages.
  const int bins = std::max(1, std::min(length, static_cast<int>(plot_w / 3)));
  const double bin_w = plot_w / bins;
  auto bin_of = [&](int stage) { return static_cast<int>(static_cast<long long>(stage) * bins / length); };
  std::vector<double> fwd(static_cast<std::size_t>(bins)), bwd(fwd), saved(fwd), out(fwd);
  std::vector<int> first(static_cast<std::size_t>(bins), -1), last(first);
  // What each stage keeps for its backward: its kept inputs, its kept outputs and its state.
  std::vector<std::int64_t> kept_inputs(static_cast<std::size_t>(length));
  for (int i = 0; i < length; ++i) {
    const Stage& s = chain.stages[static_cast<std::size_t>(i)];
    const auto b = static_cast<std::size_t>(bin_of(i));
    if (first[b] < 0) first[b] = i;
    last[b] = i;
    fwd[b] = std::max(fwd[b], s.fwd_ms);
    bwd[b] = std::max(bwd[b], s.bwd_ms);
    // Everything its backward keeps: state, kept outputs and kept inputs (which the stages on
    // either side may share).
    for (const int m : s.saved_inputs)
      kept_inputs[static_cast<std::size_t>(i)] +=
          chain.members(i)[static_cast<std::size_t>(m)].bytes;
    saved[b] = std::max(
        saved[b], static_cast<double>(s.kept_bytes() + kept_inputs[static_cast<std::size_t>(i)]));
    out[b] = std::max(out[b], static_cast<double>(s.out_bytes()));
  }
  std::vector<std::string> time_tips(static_cast<std::size_t>(bins)), byte_tips(time_tips);
  for (std::size_t b = 0; b < time_tips.size(); ++b) {
    const std::string who = stages_named(chain, first[b], last[b]);
    time_tips[b] = who + ": forward " + ms_label(fwd[b]) + ", backward " + ms_label(bwd[b]);
    if (first[b] == last[b]) {
      const Stage& s = chain.stages[static_cast<std::size_t>(first[b])];
      const std::int64_t outputs_kept = s.kept_bytes() - s.state_bytes;
      byte_tips[b] = who + ": keeps " + format_bytes(static_cast<std::int64_t>(saved[b])) +
                     " for its backward (of its input " +
                     format_bytes(kept_inputs[static_cast<std::size_t>(first[b])]) +
                     ", of its output " + format_bytes(outputs_kept) + ", its own state " +
                     format_bytes(s.state_bytes) + "); output " + format_bytes(s.out_bytes());
    } else {
      byte_tips[b] = who + ": keeps " + format_bytes(static_cast<std::int64_t>(saved[b])) +
                     " for its backward; output " + format_bytes(static_cast<std::int64_t>(out[b]));
    }
  }
  svg.root_attribute("data-bins", std::to_string(bins));
  // Stage labels: every k-th stage so that labels do not overlap.
  const int label_every = std::max(1, static_cast<int>(std::ceil(length * 34.0 / plot_w)));
  auto stage_axis = [&](double y0) {
    svg.line(kLeft, y0, kLeft + plot_w, y0, "#666", 1);
    for (int i = 0; i < length; i += label_every) {
      const double cx = kLeft + (bin_of(i) + 0.5) * bin_w;
      svg.line(cx, y0, cx, y0 + 4, "#666", 1);
      svg.text(cx, y0 + 16, std::to_string(i), "middle", 10, "fill=\"#444\"");
    }
    svg.text(kLeft + plot_w / 2, y0 + 34,
             bins < length ? "stage (bars show the largest of " + num(static_cast<double>(length) / bins) +
                                 " stages)"
                           : "stage",
             "middle", 12, "fill=\"#333\"");
  };
  auto panel = [&](double top, const std::vector<double>& a, const std::vector<double>& b,
                   const char* color_a, const char* color_b, const std::string& cls_a,
                   const std::string& cls_b, bool bytes, const std::string& title,
                   const std::vector<std::string>& tips) {
    const double largest = std::max(*std::max_element(a.begin(), a.end()),
                                    *std::max_element(b.begin(), b.end()));
    const ByteAxis axis(std::max(largest, 1.0));
    const std::vector<double> ticks =
        bytes ? axis.ticks(0, std::max(largest, 1.0) * 1.05, 5) : detail::nice_ticks(0, std::max(largest, 1e-6) * 1.05, 5);
    const Scale y{0, std::max(ticks.back(), std::max(largest, 1e-6) * 1.05), top + panel_h, top};
    detail::y_axis(svg, y, kLeft, kLeft + plot_w, ticks,
                   [&](double v) { return bytes ? axis.label(v) : ms_label(v); }, title);
    for (int k = 0; k < bins; ++k) {
      const double x0 = kLeft + k * bin_w;
      const double bar = std::max(bin_w * 0.42, 0.5);
      const auto uk = static_cast<std::size_t>(k);
      svg.rect(x0 + bin_w * 0.08, y(a[uk]), bar, y(0) - y(a[uk]), color_a,
               "class=\"" + cls_a + "\"", tips[uk]);
      svg.rect(x0 + bin_w * 0.5, y(b[uk]), bar, y(0) - y(b[uk]), color_b, "class=\"" + cls_b + "\"",
               tips[uk]);
    }
    stage_axis(top + panel_h);
  };
  panel(top1, fwd, bwd, "#4e79a7", "#e15759", "fwd", "bwd", false, "time per stage", time_tips);
  panel(top2, saved, out, "#76b7b2", "#59a14f", "saved", "out", true, "bytes per stage", byte_tips);
  legend(svg, kLeft, 52, {{"#4e79a7", "forward (fwd_ms)"}, {"#e15759", "backward (bwd_ms)"}});
  legend(svg, kLeft, top2 - 16,
         {{"#76b7b2", "kept for backward (inputs, outputs, state)"}, {"#59a14f", "output"}});
  if (band) {
    // A span per group of stages, shaded in turn, labelled where its name fits (about 6 px a
    // character at 10 px); every span says its module and stages on hover.
    svg.text(kLeft - 6, band_top + 13, "module", "end", 11, "fill=\"#333\"");
    for (std::size_t r = 0; r < runs.size(); ++r) {
      const ModuleRun& run = runs[r];
      const double x0 = kLeft + bin_of(run.first) * bin_w;
      const double x1 = kLeft + (bin_of(run.last) + 1) * bin_w;
      const std::string module = run.module.empty() ? "(unnamed)" : run.module;
      svg.rect(x0, band_top, x1 - x0, band_h, r % 2 == 0 ? "#e4e4e4" : "#c8c8c8",
               "class=\"module\" data-module=\"" + detail::xml_escape(run.module) +
                   "\" data-first=\"" + std::to_string(run.first) + "\" data-last=\"" +
                   std::to_string(run.last) + "\"",
               module + ": " + stage_range(run.first, run.last));
      // The label: the module's path, or the last parts of it that fit ("transformer.h.0" ->
      // "h.0"), or its last part cut short to at least 2 characters and "..", or none.
      std::string shown = printable(module);
      const auto room = static_cast<std::size_t>(std::max(0.0, (x1 - x0 - 4) / 6));
      for (std::size_t dot = shown.find('.'); shown.size() > room && dot != std::string::npos;
           dot = shown.find('.')) {
        shown.erase(0, dot + 1);
      }
      if (shown.size() > room) {
        if (room < 4) continue;
        shown = shortened(shown, room, "..");
      }
      svg.text((x0 + x1) / 2, band_top + 13, shown, "middle", 10,
               "class=\"module-label\" fill=\"#222\"");
    }
  }
  return svg.str();
}

}  // namespace remat
