#pragma once
/// Umbrella header of remat_base: options structs, error checks, sizes and budgets, printable
/// text, output files, and the cores and memory this process may use.

#include "remat/base/arg.h"
#include "remat/base/check.h"
#include "remat/base/cores.h"
#include "remat/base/files.h"
#include "remat/base/text.h"
#include "remat/base/units.h"
