#pragma once
// remat_distributed: data-parallel training on c10d (remat::distributed::Group, DataParallel).
#include "remat/distributed/data_parallel.h"
#include "remat/distributed/group.h"
#include "remat/distributed/launcher.h"
