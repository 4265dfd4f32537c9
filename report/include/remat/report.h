#pragma once
// remat_report: SVG pictures of schedules, trade-offs, profiles and measurements.
#include "remat/report/measurements.h"
#include "remat/report/plots.h"
