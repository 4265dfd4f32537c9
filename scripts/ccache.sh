# Sourced by the scripts that build (run.sh, torch-check.sh, fuzz.sh): every compiler call goes
# through ccache, whose cache lives outside the clone, so that a fresh clone of a commit this
# machine has already built (CI's, after a session) compiles nothing again (docs/building.md,
# "Build time").
#   remat_use_ccache   exports ccache's settings and CMake's launcher variables; a no-op
#                      without ccache (or with REMAT_CCACHE=0)
# The settings, and why:
# - CCACHE_DIR: ~/.cache/remat/ccache (beside the virtual environments), unless set already.
# - CCACHE_BASEDIR, the clone's root: paths inside it are hashed relative to the build folder,
#   so that two clones in different folders share entries.
# - CCACHE_NOHASHDIR: the builds with line tables (the sanitizer and fuzz builds) would hash
#   their working folder, which differs from clone to clone.
# - CCACHE_SLOPPINESS: the precompiled headers of the test programs (pch_defines, time_macros),
#   and headers that the configure step has just written (remat/config.h), which ccache would
#   otherwise take as too new to trust (include_file_mtime, include_file_ctime).
# - CMAKE_<LANG>_COMPILER_LAUNCHER: CMake (3.17 and later) reads them when it first configures a
#   build folder: the builds here, pip's (scikit-build-core) and tools/mutate.py's.
# - CXX: one compiler name for all of them (below).
remat_use_ccache() {
  [ "${REMAT_CCACHE:-1}" = 0 ] && return 0
  command -v ccache > /dev/null || return 0
  export CCACHE_DIR=${CCACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/remat/ccache}
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd -P)}
  export CCACHE_NOHASHDIR=1
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  # About 6 GB after the whole test command from empty (docs/building.md); room for two commits.
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-16G}
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  # One compiler name for every build: CMake's default is `c++`, but pip's build
  # (scikit-build-core) takes Python's (`g++`), and ccache tells the two names apart: the Python
  # package's LibTorch sources missed every object build/ had just compiled from them.
  export CXX=${CXX:-c++}
  export CMAKE_CUDA_COMPILER_LAUNCHER=ccache
}
