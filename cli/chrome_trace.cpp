#include "chrome_trace.h"

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>

namespace remat::cli {

std::string chrome_trace(const std::vector<TracedOperation>& trace, const Solution& solution,
                         const std::string& title) {
  const Sequence& sequence = solution.sequence;
  const std::vector<std::string> names = op_strings(sequence);
  const std::vector<TracedOperation::Kind> kinds = operation_kinds(sequence);
  nlohmann::json events = nlohmann::json::array();
  for (const auto& [tid, name] : {std::pair<int, const char*>{0, "measured"}, {1, "predicted"}})
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", tid},
                      {"args", {{"name", name}}}});
  for (const TracedOperation& op : trace)
    events.push_back({{"name", op.label},
                      {"cat", traced_kind_name(op.kind)},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", 0},
                      {"ts", op.start_ms * 1000},
                      {"dur", op.measured_ms * 1000},
                      {"args", {{"predicted_ms", op.predicted_ms}, {"measured_ms", op.measured_ms}}}});
  // A step traced with memory: a counter of MiB, measured and predicted, each operation's peak
  // from its beginning and the memory it leaves from its end.
  constexpr double kMiB = 1024.0 * 1024.0;
  for (const TracedOperation& op : trace) {
    if (op.measured_peak_bytes < 0) continue;
    for (const auto& [ts, measured, predicted] :
         {std::tuple<double, std::int64_t, std::int64_t>{op.start_ms, op.measured_peak_bytes,
                                                         op.predicted_peak_bytes},
          {op.start_ms + op.measured_ms, op.measured_after_bytes, op.predicted_after_bytes}})
      events.push_back(
          {{"name", "memory (MiB)"},
           {"ph", "C"},
           {"pid", 0},
           {"ts", ts * 1000},
           {"args", {{"measured", measured / kMiB}, {"predicted", predicted / kMiB}}}});
  }
  const std::vector<OpRecord>& predicted = solution.simulation.trace;
  for (std::size_t k = 0; k < predicted.size() && k < sequence.size(); ++k) {
    const double ms = predicted[k].end_ms - predicted[k].start_ms;
    events.push_back({{"name", names[k]},
                      {"cat", traced_kind_name(kinds[k])},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", 1},
                      {"ts", predicted[k].start_ms * 1000},
                      {"dur", ms * 1000},
                      {"args", {{"predicted_ms", ms}}}});
  }
  return nlohmann::json{{"traceEvents", events},
                        {"displayTimeUnit", "ms"},
                        {"otherData", {{"title", title}, {"schedule", collapsed_string(sequence)}}}}
             .dump(1) +
         "\n";
}

}  // namespace remat::cli
