#!/usr/bin/env bash
# Builds and tests remat against another PyTorch from PyPI than the pinned one
# (scripts/torch-requirements.txt), for a new release or an old one that README.md claims:
#
#   bash scripts/torch-check.sh 2.15.0                        # torch alone
#   bash scripts/torch-check.sh 2.14.1 --torchvision 0.29.2   # with the torchvision comparisons
#   bash scripts/torch-check.sh 2.15.0 --python-only          # only pip install . and pytest
#   bash scripts/torch-check.sh 2.15.0 --venv-only            # only make the environment
#   bash scripts/torch-check.sh 2.15.0 --venv-path            # print where it is (status 0: made)
#   bash scripts/torch-check.sh 2.0.1 --torchvision 0.15.2 --with 'numpy<2' \
#        --transformers-python ~/.cache/remat/venv-<pins>/bin/python
#
# --with SPEC adds a pip requirement to the environment (an old torch needs numpy 1);
# --transformers-python names the Python that writes the GPT-2 reference files, for a torch
# that Hugging Face transformers no longer supports (transformers 5 needs torch 2.6 or later):
# the files are read by remat's own readers, as for Debian's LibTorch 1.13 (scripts/run.sh).
#
# In a virtual environment of its own, ~/.cache/remat/venv-torch-<version> (made once, with
# the tests' Python packages of scripts/test-requirements.txt), it:
# - configures and builds build-torch/<version>/, every CUDA source with the CUDA wheel, as
#   scripts/run.sh does (without torchvision, the torchvision comparisons are left out);
# - runs its tests (CTest) and the find_package consumer (scripts/consumer-check.sh);
# - installs the Python package into that environment (pip install ., built in
#   build-torch/<version>/python) and runs tests/python.
# The environment's REMAT_TORCH_CXX_FLAGS, if set, go to the Python package's LibTorch targets
# (scripts/run.sh test sets -O1). Needs what scripts/run.sh test installs (run it once first). Exit status: 0 when everything
# passed, 1 when a build or a test failed (with --venv-path: 0 when the environment is made, 1
# when not yet), 2 for a wrong command line. docs/building.md lists the versions checked so.
set -euo pipefail
usage() { sed -n '2,/^set -e/{/^#/p}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] || usage
version=$1; shift
case "$version" in [0-9]*.[0-9]*) ;; *) usage ;; esac
torchvision="" python_only=0 venv_only=0 venv_path=0 extra=() transformers_python=""
while [ $# -gt 0 ]; do
  case "$1" in
    --torchvision) [ $# -ge 2 ] || usage; torchvision=$2; shift 2 ;;
    --with) [ $# -ge 2 ] || usage; extra+=("$2"); shift 2 ;;
    --transformers-python) [ $# -ge 2 ] || usage; transformers_python=$2; shift 2 ;;
    --python-only) python_only=1; shift ;;
    --venv-only) venv_only=1; shift ;;
    --venv-path) venv_path=1; shift ;;
    *) usage ;;
  esac
done
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
started=$SECONDS
source scripts/uv.sh
step() { echo "== [$(( (SECONDS - started) / 60 ))m$(( (SECONDS - started) % 60 ))s] $*"; }

venv=${XDG_CACHE_HOME:-$HOME/.cache}/remat/venv-torch-$version${torchvision:+-vision-$torchvision}
wanted="torch==$version${torchvision:+ torchvision==$torchvision}${extra[*]:+ ${extra[*]}}"
# Made again when the tests' packages change too.
stamp="$wanted; $(grep -v '^#' scripts/test-requirements.txt | tr '\n' ' ')"
made=0
[ "$(cat "$venv/remat-wanted" 2>/dev/null)" = "$stamp" ] && made=1
if [ "$venv_path" = 1 ]; then
  echo "$venv"
  [ "$made" = 1 ]; exit
fi
if [ "$made" = 0 ]; then
  step "installing $wanted and the tests' Python packages into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  remat_pip_install "$venv/bin/python" "torch==$version" ${torchvision:+"torchvision==$torchvision"} \
    -r scripts/test-requirements.txt scikit-build-core numpy ${extra[@]+"${extra[@]}"}
  echo "$stamp" > "$venv/remat-wanted"
fi
python=$venv/bin/python
[ "$venv_only" = 1 ] && { step "$wanted ready in $venv"; exit 0; }
prefix=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
step "PyTorch $("$python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)') at $prefix"
source scripts/cuda-compiler.sh
source scripts/ccache.sh
remat_use_ccache
remat_cuda_compiler || true
cuda=OFF
"$python" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' && cuda=ON
build=build-torch/$version

if [ "$python_only" = 0 ]; then
  step "building remat against it ($build/)"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DREMAT_WERROR=ON \
    -DCMAKE_PREFIX_PATH="$prefix" -DREMAT_REQUIRE_CUDA=$cuda -DREMAT_PYTHON="$python" \
    -DREMAT_TRANSFORMERS_PYTHON="${transformers_python:-$python}" -DREMAT_BUILD_BENCH=OFF \
    -DREMAT_SKIP_TORCHVISION_TESTS="$([ -n "$torchvision" ] && echo OFF || echo ON)" >/dev/null
  cmake --build "$build" -j "$jobs"
  step "tests ($build/)"
  ctest --test-dir "$build" --output-on-failure -j "$jobs"
  step "a project that uses find_package(remat), against it"
  bash scripts/consumer-check.sh "$build" "$prefix"
fi

step "the Python package against it: pip install . (built in $build/python), then pytest tests/python"
"$python" -m pip install -q . --config-settings=build-dir="$build/python" \
  --config-settings=cmake.define.REMAT_PYTHON_CHECK_GIL=ON --config-settings=cmake.define.REMAT_WERROR=ON \
  --config-settings=cmake.define.REMAT_TORCH_CXX_FLAGS="${REMAT_TORCH_CXX_FLAGS:-}"
"$python" -m pytest -q -p no:cacheprovider -n "$jobs" tests/python
step "all passed against PyTorch $version"
