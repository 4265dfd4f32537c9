#pragma once
// remat train --trace FILE: a traced step in Chrome's trace event format.

#include <string>
#include <vector>

#include "remat/runtime.h"
#include "remat/solver.h"

namespace remat::cli {

/// A traced step as Chrome's trace event format (chrome://tracing, Perfetto): one complete
/// event ("ph": "X") per entry of the trace on the "measured" row, and per operation of the
/// sequence at its predicted time on the "predicted" row, in microseconds; `title` and the
/// schedule in "otherData".
std::string chrome_trace(const std::vector<TracedOperation>& trace, const Solution& solution,
                         const std::string& title);

}  // namespace remat::cli
