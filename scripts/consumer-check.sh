#!/usr/bin/env bash
# Installs a build of remat and builds and runs tests/package against it: a project of its own
# that uses find_package(remat), each component's target alone, the LibTorch targets, and the
# README's example (docs/building.md, "Using an installed remat").
#
#   bash scripts/consumer-check.sh <build dir> [CMAKE_PREFIX_PATH entries after remat's...]
#
# Called by scripts/run.sh test (for build/ and build-debian/) and scripts/torch-check.sh.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 <build dir> [prefix...]" >&2; exit 2; }
cd "$(dirname "$0")/.."
build=$1; shift
rm -rf "$build/install-test" "$build/package-test"
cmake --install "$build" --prefix "$build/install-test" >/dev/null
prefixes="$PWD/$build/install-test"
for p in "$@"; do prefixes="$prefixes;$p"; done
cmake -S tests/package -B "$build/package-test" -G Ninja -DCMAKE_PREFIX_PATH="$prefixes" >/dev/null
cmake --build "$build/package-test" | tail -n 20
"$build/package-test/consumer"
for component in report core profiler runtime models distributed; do  # each target alone
  "$build/package-test/component_$component"
done
"$build/package-test/consumer_torch"
"$build/package-test/readme_example"
