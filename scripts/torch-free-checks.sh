#!/usr/bin/env bash
# The checks of the components without LibTorch (base, solver, report, CLI) that need builds of
# their own:
#   - the mutation check of the solver, simulator and report tests (tools/mutate.py, into
#     build-mutate/; not run again where the same commit passed it on this machine);
#   - the sanitizer build (build-asan/: AddressSanitizer and UBSan) and its tests.
# `bash scripts/run.sh test` starts it in the background once the Debian packages are installed,
# in a session of its own at the lowest priority (remat_below), and waits for it at the end.
# Alone, after run.sh has installed the Debian packages:
#   bash scripts/torch-free-checks.sh
# Its tests have no time limit (no TIMEOUT property, and without include(CTest) CTest sets
# none): beside the test run's builds a test may wait minutes for a core without failing for it.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
source scripts/run-lib.sh
source scripts/ccache.sh
remat_use_ccache

# The mutation check first, the sanitizer build and its tests after it: beside the test run, the
# background gets the cores only between its steps, and what is left of it at their end runs
# alone. The sanitizer build and tests keep both cores busy (a compiler or a test on each); the
# mutation check, one mutation at a time (a file or two recompiled, then the test that notices
# it), often one: it goes where the steps leave gaps, not last.
# The mutation check of the solver, simulator and report tests (tools/mutate.py, docs/testing.md):
# a mutation no test notices, and no written reason explains, fails.
mutation_key=$(passed_key '')  # HEAD: the whole tree
unless_passed mutation-check "$mutation_key" "the mutation check (tools/mutate.py, into build-mutate/)" \
  python3 tools/mutate.py

# The base, solver, report and CLI tests under AddressSanitizer + UBSan (build-asan/, without
# the LibTorch components: LibTorch itself is not instrumented). -O1 (what AddressSanitizer's
# documentation advises) and line tables only (-g1: the reports' file:line): the CLI tests' long
# test functions took 115 s to compile at -O2 -g, 54 s so.
step "building the sanitizer build (build-asan/)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREMAT_SANITIZE=ON \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DREMAT_BUILD_BENCH=OFF -DREMAT_WITH_TORCH=OFF -DREMAT_WERROR=ON >/dev/null
cmake --build build-asan -j "$jobs"
step "tests under sanitizers (build-asan/)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs"

step "the checks without LibTorch passed"
