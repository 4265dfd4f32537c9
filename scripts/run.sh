#!/usr/bin/env bash
# One-command set-up for Debian 12 (run as root, or with sudo available):
#   bash scripts/run.sh demo   install what is missing, build, run the main job
#   bash scripts/run.sh test   install what is missing, build, run every test (what CI runs)
# Both are idempotent: with everything installed and built they only re-check and re-run.
#
# remat is built against PyTorch 2.x from PyPI (the CUDA wheel users get from `pip install
# torch`, pinned in scripts/torch-requirements.txt), in a virtual environment kept outside the
# clone so that re-runs do not download it again: $REMAT_VENV, by default
# ~/.cache/remat/venv-<pins>; uv installs its packages (scripts/uv.sh). The CUDA sources are
# compiled and linked (REMAT_WITH_CUDA=1, with the CUDA toolkit's nvcc); they run only where a
# GPU is. `test` also builds and tests against Debian's LibTorch 1.13 (build-debian/), the
# Python package against the newest and the oldest PyTorch it admits too
# (scripts/torch-newest- and torch-oldest-requirements.txt, each in its own environment,
# through scripts/torch-check.sh), the solver under ASan+UBSan (build-asan/), runs the fuzz
# targets on their committed inputs (scripts/fuzz.sh --ci), the mutation check
# (tools/mutate.py) and the GPU check's CPU mode (scripts/gpu-check.sh --cpu, through
# scripts/gpu-session.sh). It first checks that the disk has room for what it will make.
set -euo pipefail
mode=${1:-demo}
case "$mode" in demo|test) ;; *) echo "usage: $0 demo|test" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
# step, passed_key, unless_passed (the checks not run again where the same files passed them).
[ "$mode" = test ] || export REMAT_CLEAN_TREE=0
source scripts/run-lib.sh
remat_record "$mode"

pins=scripts/torch-requirements.txt
venv=${REMAT_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/remat/venv-$(sha256sum "$pins" | cut -c1-12)}
# The newest and the oldest PyTorch the Python package admits (scripts/torch-newest- and
# torch-oldest-requirements.txt), for its checks against them (4d): their environments are made
# in the background while remat compiles.
# pin_args FILE: torch-check.sh's arguments for a pin file: the version, then --with REQ for
# each other requirement in it.
pin_args() {
  sed -n 's/^torch==//p' "$1"
  grep -v -e '^#' -e '^torch==' -e '^[[:space:]]*$' "$1" | while read -r requirement; do
    printf -- '--with\n%s\n' "$requirement"
  done
}
if [ "$mode" = test ]; then
  mapfile -t newest < <(pin_args scripts/torch-newest-requirements.txt)
  mapfile -t oldest < <(pin_args scripts/torch-oldest-requirements.txt)
fi

# 0. The commit messages since the convention began (CONTRIBUTING.md): a second's work.
[ "$mode" = test ] && bash scripts/check-commits.sh

# 1. Debian packages (nothing vendored, nothing downloaded at build time).
packages=(g++ cmake ninja-build ccache catch2 libfmt-dev nlohmann-json3-dev libcli11-dev libgloo-dev python3-venv)
[ "$mode" = test ] && packages+=(libtorch-dev librsvg2-bin python3-torchvision python3-dev clang libclang-rt-dev)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
done

# Disk space, before anything is installed: what this run will make that is not there yet, at
# about the size it had on a fresh machine (docs/building.md, "Disk space").
source scripts/disk-space.sh
[ ${#missing[@]} -gt 0 ] && remat_will_take 2 /usr "the Debian packages"
cmp -s "$pins" "$venv/remat-requirements.txt" || remat_will_take 5 "$venv" "the pinned PyTorch's environment"
[ -d build ] || remat_will_take 3 build "build/"
if [ "$mode" = test ]; then
  newest_dir=$(bash scripts/torch-check.sh "${newest[@]}" --venv-path) ||
    remat_will_take 6 "$newest_dir" "PyTorch ${newest[0]}'s environment"
  oldest_dir=$(bash scripts/torch-check.sh "${oldest[@]}" --venv-path) ||
    remat_will_take 5 "$oldest_dir" "PyTorch ${oldest[0]}'s environment"
  [ -d build-debian ] || remat_will_take 3 build-debian "build-debian/"
  remat_will_take 1 . "the other builds"
fi
step "checking the disk space"
remat_check_disk || exit 1

if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Every build below goes through ccache, its cache in ~/.cache/remat/ccache (scripts/ccache.sh):
# a fresh clone of a commit this machine has built compiles nothing again.
source scripts/ccache.sh
remat_use_ccache
command -v ccache > /dev/null && ccache --zero-stats > /dev/null

# 2a. The checks of the components without LibTorch that need builds of their own (the
# sanitizer build and its tests, the mutation check: scripts/torch-free-checks.sh), in the
# background at the lowest priority (remat_below, scripts/run-lib.sh): they take what the steps
# below leave of the cores. Collected at the end, after the GPU check's CPU mode (whose timing
# wants the cores: at nice 19 they leave them to it); stopped if this run stops.
if [ "$mode" = test ]; then
  mkdir -p build-checks && checks_log=build-checks/output.log
  # Every compilation's ccache log, for the run's record at the end: which sources missed (a
  # warm run, CI's among them, should miss only what changed).
  export CCACHE_LOGFILE=${CCACHE_LOGFILE:-$PWD/build-checks/ccache.log}
  rm -f "$CCACHE_LOGFILE"
  step "the mutation check, the sanitizer build and its tests: in the background at the lowest priority (scripts/torch-free-checks.sh, into $checks_log)"
  remat_below "$checks_log" bash scripts/torch-free-checks.sh
  checks=$!
  trap 'pkill -TERM -s "$checks" 2>/dev/null || true' EXIT
fi

# 2. PyTorch 2.x from PyPI, in a virtual environment outside the clone (reused while the pins
# are unchanged; a half-made one is made again), its packages installed by uv (scripts/uv.sh).
source scripts/uv.sh
if ! cmp -s "$pins" "$venv/remat-requirements.txt"; then
  step "installing PyTorch from PyPI into $venv ($(grep -v '^#' "$pins" | tr '\n' ' '))"
  python=$(command -v python3)
  "$python" -m venv --help >/dev/null 2>&1 || python=/usr/bin/python3
  rm -rf "$venv"
  "$python" -m venv "$venv"
  remat_pip_install "$venv/bin/python" -r "$pins"
  cp "$pins" "$venv/remat-requirements.txt"
fi
venv_python=$venv/bin/python
# The tests' own Python dependencies (Hugging Face transformers and safetensors, for the GPT-2
# references; pytest), pinned in scripts/test-requirements.txt, installed once into the same
# environment.
if [ "$mode" = test ] && ! cmp -s scripts/test-requirements.txt "$venv/remat-test-requirements.txt"; then
  step "installing the tests' Python packages ($(grep -v '^#' scripts/test-requirements.txt | tr '\n' ' '))"
  remat_pip_install "$venv_python" -r scripts/test-requirements.txt
  cp scripts/test-requirements.txt "$venv/remat-test-requirements.txt"
fi
# The models the "any model" tests train besides torchvision's and Hugging Face's (timm), and
# Hugging Face's Trainer (accelerate): without their dependencies, which transformers brought.
if [ "$mode" = test ] && ! cmp -s scripts/test-model-requirements.txt "$venv/remat-test-model-requirements.txt"; then
  step "installing the model tests' Python packages ($(grep -v '^#' scripts/test-model-requirements.txt | tr '\n' ' '))"
  remat_pip_install "$venv_python" --no-deps -r scripts/test-model-requirements.txt
  cp scripts/test-model-requirements.txt "$venv/remat-test-model-requirements.txt"
fi
if [ "$mode" = test ]; then
  newest_log=$(mktemp) oldest_log=$(mktemp)
  bash scripts/torch-check.sh "${newest[@]}" --venv-only > "$newest_log" 2>&1 &
  newest_venv=$!
  bash scripts/torch-check.sh "${oldest[@]}" --venv-only > "$oldest_log" 2>&1 &
  oldest_venv=$!
fi
torch_prefix=$("$venv_python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
step "PyTorch $("$venv_python" -c 'import torch; print(torch.__version__)') at $torch_prefix"

# The CUDA wheel's CMake files need the CUDA toolkit (nvcc) to configure.
source scripts/cuda-compiler.sh
if ! remat_cuda_compiler; then
  echo "remat: the CUDA toolkit (nvcc) is needed to build against PyTorch's CUDA wheel; install it or set CUDACXX" >&2; exit 1
fi

# 3. Build (Release) into build/ against that PyTorch, with every CUDA source.
step "building remat against PyTorch's LibTorch with CUDA (build/)"
# `test` compiles the LibTorch targets at -O1 (REMAT_TORCH_CXX_FLAGS): they only run the tests
# and the GPU check's CPU mode, whose time is LibTorch's, and -O1 compiles a LibTorch
# translation unit in about two thirds of -O3's time; the components without LibTorch (the
# solver, the reports) stay at -O3. `demo` builds everything at -O3. The Python packages below
# take the same flags (the one against this PyTorch shares build/'s objects through ccache).
torch_flags=""
[ "$mode" = test ] && torch_flags=-O1
export REMAT_TORCH_CXX_FLAGS=$torch_flags
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DREMAT_WERROR=ON \
  -DCMAKE_PREFIX_PATH="$torch_prefix" -DREMAT_REQUIRE_CUDA=ON -DREMAT_PYTHON="$venv_python" \
  -DREMAT_REQUIRE_REFERENCE_TESTS=ON -DREMAT_TORCH_CXX_FLAGS="$torch_flags" >/dev/null
if [ "$mode" = demo ]; then
  # 4a. The main job: profile a built-in network on CPU, choose a schedule at half its
  # store-all peak, train a few steps with it, measured against predicted. Only the remat
  # program is built (the tests and benchmarks are for `test`).
  cmake --build build -j "$jobs" --target remat
  step "remat demo"
  exec build/bin/remat demo
fi
cmake --build build -j "$jobs"

# 4b. Every test against PyTorch 2.x, then an installed remat used through find_package.
step "tests (build/, PyTorch 2.x)"
ctest --test-dir build --output-on-failure -j "$jobs"
step "a project that uses find_package(remat), against PyTorch 2.x"
bash scripts/consumer-check.sh build "$torch_prefix"

# 4c. The Python package, built by pip against the same PyTorch, and its tests.
step "the Python package: pip install . (PyTorch 2.x), then pytest tests/python"
"$venv_python" -m pip install -q . --config-settings=cmake.define.REMAT_PYTHON_CHECK_GIL=ON \
  --config-settings=cmake.define.REMAT_WERROR=ON \
  --config-settings=cmake.define.REMAT_TORCH_CXX_FLAGS="$torch_flags"
# One process per core (pytest-xdist): each test uses one.
"$venv_python" -m pytest -q -p no:cacheprovider -n "$jobs" tests/python

# 4d. The same against the newest PyTorch on PyPI, which users' `pip install .` most often
# builds against (its LibTorch holds autograd nodes differently and needs C++20), and against
# the oldest the package admits (old string ABI, older pybind11 and autocast:
# docs/building.md).
# check_python_against JOB LOG DIR VERSION [--with REQ]...: once the background JOB has made
# that PyTorch's environment in DIR (its output in LOG), the package built against it and its
# tests.
check_python_against() {
  local job=$1 log=$2 dir=$3 free
  shift 3
  step "the Python package against PyTorch $1 (scripts/torch-check.sh $* --python-only)"
  wait "$job" || { cat "$log" >&2; echo "could not install PyTorch $1" >&2; exit 1; }
  rm -f "$log"
  # 40 of the 200 random networks (tests/python/test_random_chains.py), and those that found
  # defects: the other 160 ran against the pinned PyTorch above; nor torchvision's large models
  # whole (tests/python/test_models_as_they_come.py), which did too.
  REMAT_RANDOM_NETWORKS=40 REMAT_TORCHVISION_MODELS=0 bash scripts/torch-check.sh "$@" --python-only
  # Where this run has nearly filled the disk, that environment goes (the next run makes it
  # again): what is left of the run needs about 6 GB.
  free=$(remat_free_gb "$dir")
  if [ "$free" -lt 8 ]; then
    step "removing $dir to leave room ($free GB free; it is made again when needed)"
    rm -rf "$dir"
  fi
}
check_python_against "$newest_venv" "$newest_log" "$newest_dir" "${newest[@]}"
check_python_against "$oldest_venv" "$oldest_log" "$oldest_dir" "${oldest[@]}"

# 5. Debian's LibTorch 1.13 (CPU): build, every test of what uses LibTorch, the find_package
# consumer. At -O1: this build only runs the tests (no benchmark), whose time is LibTorch's,
# and -O1 compiles a LibTorch translation unit in two thirds of -O3's time (docs/building.md,
# "Build time"). The solver's and the reports' tests, the same code whatever the LibTorch, ran
# in build/ and run again under sanitizers below (REMAT_TEST_TORCH_FREE=OFF).
step "building remat against Debian's LibTorch 1.13 (build-debian/)"
cmake -S . -B build-debian -G Ninja -DCMAKE_BUILD_TYPE=Release -DREMAT_WERROR=ON \
  -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DREMAT_BUILD_BENCH=OFF -DREMAT_TEST_TORCH_FREE=OFF \
  -DREMAT_PYTHON=/usr/bin/python3 -DREMAT_TRANSFORMERS_PYTHON="$venv_python" \
  -DREMAT_REQUIRE_REFERENCE_TESTS=ON >/dev/null
cmake --build build-debian -j "$jobs"
step "tests (build-debian/, LibTorch 1.13)"
# Nor the tests whose subject does not depend on the LibTorch, which ran in build/: the docs'
# examples (their text), the ports' names, shapes and parameter counts (the same modules are
# built and trained by the tests that run here), the CLI's GPT-2 options (the transformers
# train here through models_tests). About 160 s of the 2 cores' time. Nor Inception v3 by
# branch trained checkpointed (26 s): tuple stages that carry the block's input and finished
# branches, as the runtime's tuple-stage tests and Inception's auxiliary logits train here.
left_to_build='^(cli:the examples in docs/|cli:the transformers: |models:every parameter and buffer has a distinct torchvision name|models:the ports have torchvision.s names and shapes at full size|models:the ports have torchvision.s parameter counts|models:Inception v3 at branch granularity)'
ctest --test-dir build-debian --output-on-failure -j "$jobs" -E "$left_to_build"
step "a project that uses find_package(remat), against LibTorch 1.13"
bash scripts/consumer-check.sh build-debian

# 7. The libFuzzer targets (fuzz/: the chain parser, the solver on extreme chains, the
# state-dict and safetensors readers), built with clang, each input committed in fuzz/corpus/
# run once: the same inputs on every run.
fuzz_key=$(passed_key fuzz base solver models/src/state_dict.cpp models/src/safetensors.cpp models/include \
                      core/include scripts/fuzz.sh scripts/ccache.sh)
unless_passed fuzzing "$fuzz_key" "fuzzing, the committed inputs (scripts/fuzz.sh --ci, into build-fuzz/)" \
  bash scripts/fuzz.sh --ci

# 9. The GPU check in its CPU mode (tiny sizes), on the build above: its tables and plots,
# through gpu-session.sh (in the background, collected by `wait`), as on the GPU machine. It
# needs the cores: beside a build as its equal, its fidelity part's timing took 368 s instead of
# 20 (2026-11-30); the background checks, at nice 19, leave them to it.
step "the GPU check's CPU mode (scripts/gpu-session.sh start --cpu, into build/gpu-session/)"
session=(env REMAT_PYTHON="$venv_python" REMAT_SESSION_DIR=build/gpu-session
         bash scripts/gpu-session.sh --out build/gpu-check-cpu)
code=0
"${session[@]}" start --cpu --build build || code=$?
for _ in 1 2; do  # about a minute in all; a check still running after 18 min has hung
  [ "$code" = 3 ] || break
  code=0; "${session[@]}" wait || code=$?
done
[ "$code" = 0 ] || { echo "the GPU check's CPU mode failed (exit $code)" >&2; exit 1; }
# Its report (CPU times miss the GPU's targets: not --strict), and the report's own tests.
# The chains it profiled are copied out (as from a GPU's results, for bench/gpu-profiles/) and
# solved again from their files, as a machine without a GPU would.
rm -rf build/gpu-check-cpu/chains
"$venv_python" tools/gpu_results.py build/gpu-check-cpu/results.tar.gz \
  --markdown build/gpu-check-cpu/report.md --img-dir build/gpu-check-cpu/img \
  --chains-dir build/gpu-check-cpu/chains > /dev/null
chains=(build/gpu-check-cpu/chains/*.json)
[ -f "${chains[0]}" ] || { echo "the GPU check's CPU mode saved no chains" >&2; exit 1; }
for chain in "${chains[@]}"; do  # exit 3: infeasible at 50%, a result, not a failure
  code=0; build/bin/remat schedule --chain "$chain" --budget 50% > /dev/null || code=$?
  [ "$code" = 0 ] || [ "$code" = 3 ] || { echo "remat schedule --chain $chain: exit $code" >&2; exit 1; }
done
"$venv_python" -m pytest -q -p no:cacheprovider tests/tools

# 10. The checks started in the background (2a), once nothing else runs: their steps, as they
# ran, and their outcome.
step "the mutation check, the sanitizer build and its tests (started in the background): waiting"
code=0; wait "$checks" || code=$?
trap - EXIT
if [ "$code" != 0 ]; then
  cat "$checks_log" >&2
  echo "remat: the checks without LibTorch failed (exit $code; scripts/torch-free-checks.sh, its output above and in $checks_log)" >&2
  exit 1
fi
sed -n 's/^== /   background: /p' "$checks_log"

if command -v ccache > /dev/null; then
  step "ccache: $(ccache --print-stats | awk -F'\t' '$1=="direct_cache_hit"{d=$2} $1=="preprocessed_cache_hit"{p=$2} $1=="cache_miss"{m=$2} END{printf "%d hits (%d direct), %d misses", d+p, d, m}')"
  remat_ccache_misses "$CCACHE_LOGFILE"
fi
step "all tests passed"
