#pragma once
/// Umbrella header of remat_solver: chains, sequences, the simulator and the algorithms, with
/// remat_base under them.

#include "remat/base.h"
#include "remat/solver/chain.h"
#include "remat/solver/partition.h"
#include "remat/solver/sequence.h"
#include "remat/solver/simulator.h"
#include "remat/solver/solver.h"
#include "remat/solver/tradeoff.h"
