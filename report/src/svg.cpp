#include "svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "remat/base/text.h"

namespace remat::detail {

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  // Control characters, U+FFFE/U+FFFF and bytes that are not UTF-8 are not allowed in XML 1.0,
  // not even as character references: they are written as the terminal shows them (\x1b).
  for (const char c : printable(text)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double value) {
  if (!std::isfinite(value)) return "0";
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.2f", value);
  std::string out = buffer;
  while (!out.empty() && out.back() == '0') out.pop_back();
  if (!out.empty() && out.back() == '.') out.pop_back();
  if (out == "-0") out = "0";
  return out;
}

Svg::Svg(double width, double height) : width_(width), height_(height) {}

void Svg::root_attribute(const std::string& key, const std::string& value) {
  root_attributes_ += " " + key + "=\"" + xml_escape(value) + "\"";
}
void Svg::open_group(const std::string& attributes) { body_ += "<g " + attributes + ">\n"; }
void Svg::close_group() { body_ += "</g>\n"; }

void Svg::rect(double x, double y, double w, double h, const std::string& fill,
               const std::string& attributes, const std::string& tooltip) {
  body_ += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(std::max(0.0, w)) +
           "\" height=\"" + num(std::max(0.0, h)) + "\" fill=\"" + fill + "\"" +
           (attributes.empty() ? "" : " " + attributes) +
           (tooltip.empty() ? "/>\n" : "><title>" + xml_escape(tooltip) + "</title></rect>\n");
}

void Svg::line(double x1, double y1, double x2, double y2, const std::string& stroke,
               double width, const std::string& attributes) {
  body_ += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" +
           num(y2) + "\" stroke=\"" + stroke + "\" stroke-width=\"" + num(width) + "\"" +
           (attributes.empty() ? "" : " " + attributes) + "/>\n";
}

void Svg::polyline(const std::vector<std::pair<double, double>>& points, const std::string& stroke,
                   double width, const std::string& attributes) {
  std::string coordinates;
  for (const auto& [x, y] : points) coordinates += (coordinates.empty() ? "" : " ") + num(x) + "," + num(y);
  body_ += "<polyline points=\"" + coordinates + "\" fill=\"none\" stroke=\"" + stroke +
           "\" stroke-width=\"" + num(width) + "\" stroke-linejoin=\"round\"" +
           (attributes.empty() ? "" : " " + attributes) + "/>\n";
}

void Svg::circle(double cx, double cy, double r, const std::string& fill,
                 const std::string& attributes) {
  body_ += "<circle cx=\"" + num(cx) + "\" cy=\"" + num(cy) + "\" r=\"" + num(r) + "\" fill=\"" +
           fill + "\"" + (attributes.empty() ? "" : " " + attributes) + "/>\n";
}

void Svg::text(double x, double y, const std::string& content, const std::string& anchor,
               double size, const std::string& attributes) {
  body_ += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" text-anchor=\"" + anchor +
           "\" font-size=\"" + num(size) + "\"" + (attributes.empty() ? "" : " " + attributes) +
           ">" + xml_escape(content) + "</text>\n";
}

std::string Svg::str() const {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
         "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width_) + "\" height=\"" +
         num(height_) + "\" viewBox=\"0 0 " + num(width_) + " " + num(height_) +
         "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\"" + root_attributes_ +
         ">\n<rect x=\"0\" y=\"0\" width=\"" + num(width_) + "\" height=\"" + num(height_) +
         "\" fill=\"white\"/>\n" + body_ + "</svg>\n";
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / std::max(1, target);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (const double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  std::vector<double> out;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    out.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return out;
}

ByteAxis::ByteAxis(double largest) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int k = 0;
  while (k < 4 && largest >= 1024.0 * divisor) {
    divisor *= 1024.0;
    ++k;
  }
  unit = kUnits[k];
}

std::vector<double> ByteAxis::ticks(double lo, double hi, int target) const {
  std::vector<double> out = nice_ticks(lo / divisor, hi / divisor, target);
  for (double& v : out) v *= divisor;
  return out;
}

std::string ByteAxis::label(double bytes) const { return num(bytes / divisor) + " " + unit; }

double legend(Svg& svg, double x, double y, const std::vector<LegendEntry>& entries) {
  for (const LegendEntry& e : entries) {
    switch (e.kind) {
      case LegendEntry::kBox: svg.rect(x, y - 9, 12, 12, e.color, "class=\"legend\""); break;
      case LegendEntry::kLine: svg.line(x, y - 3, x + 14, y - 3, e.color, 2.5, "class=\"legend\""); break;
      case LegendEntry::kDashed:
        svg.line(x, y - 3, x + 14, y - 3, e.color, 2, "class=\"legend\" stroke-dasharray=\"4 3\"");
        break;
      case LegendEntry::kDot: svg.circle(x + 6, y - 3, 4, e.color, "class=\"legend\""); break;
    }
    svg.text(x + 18, y + 1, e.label, "start", 12);
    x += 18 + 7.0 * static_cast<double>(e.label.size()) + 18;
  }
  return x;
}

void y_axis(Svg& svg, const Scale& y, double x0, double x1, const std::vector<double>& ticks,
            const std::function<std::string(double)>& label, const std::string& title) {
  for (const double v : ticks) {
    const double py = y(v);
    svg.line(x0, py, x1, py, "#e3e3e3", 1);
    svg.text(x0 - 6, py + 4, label(v), "end", 11, "class=\"y-tick\" fill=\"#444\"");
  }
  svg.line(x0, y.r0, x0, y.r1, "#666", 1);
  const double mid = (y.r0 + y.r1) / 2;
  svg.text(x0 - 62, mid, title, "middle", 12,
           "transform=\"rotate(-90 " + num(x0 - 62) + " " + num(mid) + ")\" fill=\"#333\"");
}

void x_axis(Svg& svg, const Scale& x, double y0, double y1, const std::vector<double>& ticks,
            const std::function<std::string(double)>& label, const std::string& title) {
  for (const double v : ticks) {
    const double px = x(v);
    if (y1 != y0) svg.line(px, y1, px, y0, "#eeeeee", 1);
    svg.line(px, y0, px, y0 + 4, "#666", 1);
    svg.text(px, y0 + 17, label(v), "middle", 11, "class=\"x-tick\" fill=\"#444\"");
  }
  svg.line(x.r0, y0, x.r1, y0, "#666", 1);
  svg.text((x.r0 + x.r1) / 2, y0 + 34, title, "middle", 12, "fill=\"#333\"");
}

}  // namespace remat::detail
