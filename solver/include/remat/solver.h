#pragma once
/// Umbrella header of remat_solver: chains, sequences, the simulator and the algorithms.

#include "remat/solver/chain.h"
#include "remat/solver/check.h"
#include "remat/solver/files.h"
#include "remat/solver/partition.h"
#include "remat/solver/sequence.h"
#include "remat/solver/simulator.h"
#include "remat/solver/solver.h"
#include "remat/solver/text.h"
#include "remat/solver/tradeoff.h"
#include "remat/solver/units.h"
