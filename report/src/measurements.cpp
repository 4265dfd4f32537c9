// Measured series against memory (remat/report/measurements.h).
#include "remat/report/measurements.h"

#include <algorithm>
#include <stdexcept>

#include "svg.h"

namespace remat {
namespace {

constexpr double kLeft = 96, kRight = 28;
// Series colors, then repeated (Tableau 10).
const char* const kColors[] = {"#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1",
                               "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#bab0ac"};

}  // namespace

std::string measurement_svg(const MeasurementPlot& plot) {
  double x0 = 0, x1 = 0, y0 = 0, y1 = 0;
  bool any = false;
  for (const MeasurementSeries& s : plot.series)
    for (const MeasuredPoint& p : s.points) {
      x0 = any ? std::min(x0, p.bytes) : p.bytes;
      x1 = any ? std::max(x1, p.bytes) : p.bytes;
      y0 = any ? std::min(y0, p.value) : p.value;
      y1 = any ? std::max(y1, p.value) : p.value;
      any = true;
    }
  if (!any) throw std::invalid_argument("measurement plot '" + plot.title + "': no point to draw");
  const double width = std::max(600, plot.width);
  const double plot_w = width - kLeft - kRight;
  const double top = 84, plot_h = 440;
  detail::Svg svg(width, top + plot_h + 70);
  svg.root_attribute("data-kind", "measurements");
  svg.root_attribute("data-series", std::to_string(plot.series.size()));

  // Values from 0 (throughput is read as a fraction of the best); bytes around the points.
  y0 = std::min(0.0, y0);
  const double xpad = std::max((x1 - x0) * 0.05, std::max(x1 * 0.02, 1.0));
  const detail::ByteAxis bytes_axis(x1 + xpad);
  const detail::Scale x{std::max(0.0, x0 - xpad), x1 + xpad, kLeft, kLeft + plot_w};
  const std::vector<double> yticks = detail::nice_ticks(y0, y1 * 1.08, 7);
  const detail::Scale y{y0, std::max(yticks.back(), y1 * 1.08), top + plot_h, top};
  std::vector<double> xshown;
  for (double v : bytes_axis.ticks(x.d0, x.d1, 8))
    if (v >= x.d0 && v <= x.d1) xshown.push_back(v);
  detail::y_axis(svg, y, kLeft, kLeft + plot_w, yticks, [](double v) { return detail::num(v); },
                 plot.value_axis);
  detail::x_axis(svg, x, top + plot_h, top, xshown, [&](double v) { return bytes_axis.label(v); },
                 plot.bytes_axis);
  svg.text(kLeft, 26, plot.title, "start", 15, "font-weight=\"bold\"");

  std::vector<detail::LegendEntry> entries;
  for (std::size_t k = 0; k < plot.series.size(); ++k) {
    const MeasurementSeries& s = plot.series[k];
    const std::string color = kColors[k % (sizeof kColors / sizeof kColors[0])];
    entries.push_back({color, s.name, s.connect ? detail::LegendEntry::kLine : detail::LegendEntry::kDot});
    std::vector<MeasuredPoint> points = s.points;
    std::sort(points.begin(), points.end(),
              [](const MeasuredPoint& a, const MeasuredPoint& b) { return a.bytes < b.bytes; });
    svg.open_group("class=\"series\" data-series=\"" + detail::xml_escape(s.name) + "\"");
    if (s.connect && points.size() > 1) {
      std::vector<std::pair<double, double>> line;
      for (const MeasuredPoint& p : points) line.emplace_back(x(p.bytes), y(p.value));
      svg.polyline(line, color, 2);
    }
    for (const MeasuredPoint& p : points) {
      svg.circle(x(p.bytes), y(p.value), 4.5, color,
                 "class=\"point\" data-series=\"" + detail::xml_escape(s.name) + "\" data-bytes=\"" +
                     detail::num(p.bytes) + "\" data-value=\"" + detail::num(p.value) + "\"");
      if (!p.label.empty()) svg.text(x(p.bytes) + 6, y(p.value) - 6, p.label, "start", 10);
    }
    svg.close_group();
  }
  detail::legend(svg, kLeft, 52, entries);
  return svg.str();
}

}  // namespace remat
