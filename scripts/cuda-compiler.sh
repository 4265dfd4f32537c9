# shellcheck shell=bash
# Sourced by the build scripts (run.sh, torch-check.sh, gpu-check.sh): remat_cuda_compiler
# exports CUDACXX, the CUDA compiler that the CMake files of PyTorch's CUDA wheel need to
# configure, unless it is set already: nvcc on the PATH, else the toolkit's usual place.
# Returns 1, with CUDACXX left unset, when there is none.
#
# The nvcc found is named by its real place, the one nvcc itself reports (its TOP folder),
# not by the name on the PATH: the same toolkit reached through /usr/local/cuda/bin (a link)
# and through a wrapper script in /usr/local/bin made CMake find its headers under two folder
# names, and ccache, which hashes those names, missed every object that includes a CUDA header
# whenever two runs had different PATHs (CI's and a session's: docs/building.md, "How long
# `test` takes").
remat_cuda_compiler() {
  if [ -n "${CUDACXX:-}" ]; then return 0; fi
  local nvcc top
  if command -v nvcc >/dev/null; then nvcc=$(command -v nvcc)
  elif [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc
  else return 1
  fi
  top=$("$nvcc" --dryrun -E -x cu /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1) || true
  if [ -n "$top" ] && [ -x "$top/bin/nvcc" ]; then nvcc=$top/bin/nvcc; fi
  nvcc=$(readlink -f "$nvcc")
  export CUDACXX=$nvcc
}
