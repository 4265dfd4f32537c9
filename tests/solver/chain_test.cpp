#include <catch2/catch.hpp>

#include "remat/solver.h"

TEST_CASE("placeholder", "[solver]") { REQUIRE(remat::parse_size("1KiB") == 1024); }
