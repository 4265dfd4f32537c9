# shellcheck shell=bash
# Sourced by the build scripts (run.sh, torch-check.sh, gpu-check.sh): remat_cuda_compiler
# exports CUDACXX, the CUDA compiler that the CMake files of PyTorch's CUDA wheel need to
# configure, unless it is set already: nvcc on the PATH, else the toolkit's usual place.
# Returns 1, with CUDACXX left unset, when there is none.
remat_cuda_compiler() {
  if [ -n "${CUDACXX:-}" ]; then return 0; fi
  if command -v nvcc >/dev/null; then export CUDACXX; CUDACXX=$(command -v nvcc)
  elif [ -x /usr/local/cuda/bin/nvcc ]; then export CUDACXX=/usr/local/cuda/bin/nvcc
  else return 1
  fi
}
