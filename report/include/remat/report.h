#pragma once
// remat_report: SVG pictures of schedules, trade-offs and profiles.
#include "remat/report/plots.h"
