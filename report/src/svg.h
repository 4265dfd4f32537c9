#pragma once
// A small SVG writer and the axis helpers the plots share (internal).
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace remat::detail {

/// Text for XML: remat::printable (control characters, U+FFFE/U+FFFF and bytes that are not
/// UTF-8 as \xNN, as the terminal shows them), then &, <, >, " escaped.
std::string xml_escape(const std::string& text);
/// A coordinate or value, at most 2 decimals, no trailing zeros ("12", "3.5").
std::string num(double value);

class Svg {
 public:
  Svg(double width, double height);
  /// Adds an attribute to the root element (data-*, for tests and scripts).
  void root_attribute(const std::string& key, const std::string& value);
  void open_group(const std::string& attributes);
  void close_group();
  /// `tooltip`, if not empty, is the rectangle's <title>: what a viewer shows on hover.
  void rect(double x, double y, double w, double h, const std::string& fill,
            const std::string& attributes = "", const std::string& tooltip = "");
  void line(double x1, double y1, double x2, double y2, const std::string& stroke, double width,
            const std::string& attributes = "");
  void polyline(const std::vector<std::pair<double, double>>& points, const std::string& stroke,
                double width, const std::string& attributes = "");
  void circle(double cx, double cy, double r, const std::string& fill,
              const std::string& attributes = "");
  /// anchor: start, middle or end.
  void text(double x, double y, const std::string& content, const std::string& anchor = "start",
            double size = 12, const std::string& attributes = "");
  std::string str() const;

 private:
  double width_, height_;
  std::string root_attributes_, body_;
};

/// Maps [d0, d1] onto [r0, r1].
struct Scale {
  double d0 = 0, d1 = 1, r0 = 0, r1 = 1;
  double operator()(double v) const {
    return d1 == d0 ? r0 : r0 + (v - d0) * (r1 - r0) / (d1 - d0);
  }
};

/// Round tick values covering [lo, hi], about `target` of them (steps 1, 2, 5 x 10^k).
std::vector<double> nice_ticks(double lo, double hi, int target);

/// Byte values shown in the unit that suits `largest` (B, KiB, MiB, GiB, TiB).
struct ByteAxis {
  double divisor = 1;
  std::string unit = "B";
  explicit ByteAxis(double largest);
  /// Ticks at round numbers of the unit.
  std::vector<double> ticks(double lo, double hi, int target) const;
  std::string label(double bytes) const;
};

struct LegendEntry {
  std::string color;
  std::string label;
  enum Kind { kBox, kLine, kDashed, kDot } kind = kBox;
};
/// A row of legend entries starting at (x, y); returns the x after the last one.
double legend(Svg& svg, double x, double y, const std::vector<LegendEntry>& entries);

/// Left axis with grid lines across [x0, x1]; `label` formats a tick value.
void y_axis(Svg& svg, const Scale& y, double x0, double x1, const std::vector<double>& ticks,
            const std::function<std::string(double)>& label, const std::string& title);
/// Bottom axis at y0 (grid lines up to y1).
void x_axis(Svg& svg, const Scale& x, double y0, double y1, const std::vector<double>& ticks,
            const std::function<std::string(double)>& label, const std::string& title);

}  // namespace remat::detail
