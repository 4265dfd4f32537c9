#!/usr/bin/env bash
# One-command set-up for Debian 12 (run as root, or with sudo available):
#   bash scripts/run.sh demo   install what is missing, build, run the main job
#   bash scripts/run.sh test   install what is missing, build, run every test (what CI runs)
# Both are idempotent: with everything installed and built they only re-check and re-run.
set -euo pipefail
mode=${1:-demo}
case "$mode" in demo|test) ;; *) echo "usage: $0 demo|test" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

# 1. Debian packages (nothing vendored, nothing downloaded at build time).
packages=(g++ cmake ninja-build catch2 libfmt-dev nlohmann-json3-dev libcli11-dev libtorch-dev)
[ "$mode" = test ] && packages+=(librsvg2-bin python3-torchvision)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# 2. Build (Release) into build/.
echo "== building remat (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DREMAT_WERROR=ON >/dev/null
cmake --build build -j "$jobs"

if [ "$mode" = demo ]; then
  # 3a. The main job: profile a built-in network on CPU, choose a schedule at half its
  # store-all peak, train a few steps with it, measured against predicted.
  echo "== remat demo"
  exec build/bin/remat demo
fi

# 3b. Every test, then the solver and CLI tests again under AddressSanitizer + UBSan
# (build-asan/, without the LibTorch components: LibTorch itself is not instrumented).
echo "== tests (build/)"
ctest --test-dir build --output-on-failure -j "$jobs"
echo "== installing into build/install-test and building a project that uses find_package(remat)"
rm -rf build/install-test build/package-test
cmake --install build --prefix build/install-test >/dev/null
cmake -S tests/package -B build/package-test -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/install-test" >/dev/null
cmake --build build/package-test | tail -n 20
build/package-test/consumer
[ -x build/package-test/consumer_torch ] && build/package-test/consumer_torch
echo "== building the sanitizer build (build-asan/)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREMAT_SANITIZE=ON \
  -DREMAT_BUILD_BENCH=OFF -DREMAT_WITH_TORCH=OFF -DREMAT_WERROR=ON >/dev/null
cmake --build build-asan -j "$jobs"
echo "== tests under sanitizers (build-asan/)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs"
echo "== all tests passed"
