#pragma once
/// A picture of measurements: named series of points with a memory size on the x axis (peak
/// bytes) and a number on the y axis (images per second, milliseconds, ...), as the GPU
/// check's throughput benchmark draws them: one series per method.
///
///   remat::MeasurementPlot plot("resnet50 b32: throughput against peak memory", "images/s");
///   plot.series.push_back({"remat optimal", {{1.2e9, 850, "50%"}, {2.4e9, 900, "100%"}}, true});
///   remat::write_text_file("throughput.svg", remat::measurement_svg(plot));

#include <cstdint>
#include <string>
#include <vector>

#include "remat/solver/solver.h"  // REMAT_ARG

namespace remat {

struct MeasuredPoint {
  /// Bytes (x axis).
  double bytes = 0;
  /// The measured value (y axis).
  double value = 0;
  /// Written next to the point ("50%", "K=4"); may be empty.
  std::string label;
};

struct MeasurementSeries {
  std::string name;
  std::vector<MeasuredPoint> points;
  /// Joined by a line in the order of increasing bytes (a curve), or points alone.
  bool connect = true;
};

struct MeasurementPlot {
  MeasurementPlot(std::string title_, std::string value_axis_) : title(std::move(title_)), value_axis(std::move(value_axis_)) {}
  std::string title;
  /// The y axis's title ("images per second").
  std::string value_axis;
  /// The x axis's title.
  std::string bytes_axis = "peak memory";
  std::vector<MeasurementSeries> series;
  /// Picture width in pixels.
  int width = 1200;
};

/// The plot as standalone SVG; every point is a circle with data-series, data-bytes and
/// data-value attributes. Throws std::invalid_argument when there is no point to draw.
std::string measurement_svg(const MeasurementPlot& plot);

}  // namespace remat
