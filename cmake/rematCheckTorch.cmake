# remat_check_torch(): after find_package(Torch), refuses a LibTorch that is not whole, gives
# the linker the library folders of pip's torch (remat_torch_link_paths, below), and asks for
# the C++ standard that LibTorch's headers need (remat_torch_cxx_standard, below).
# TorchConfig.cmake looks its libraries up on the system paths before its own folder: with pip's
# torch named by its share/cmake folder and Debian's libtorch-dev installed, it links Debian's
# libraries against pip's headers, which fails late and obscurely (or, worse, runs).
function(remat_check_torch)
  get_filename_component(prefix "${TORCH_INSTALL_PREFIX}" REALPATH)
  get_filename_component(library "${TORCH_LIBRARY}" REALPATH)
  string(FIND "${library}" "${prefix}/" at)
  if(NOT at EQUAL 0)
    message(FATAL_ERROR "remat: the LibTorch configuration in ${Torch_DIR} found its library at "
      "${TORCH_LIBRARY}, outside its own prefix ${TORCH_INSTALL_PREFIX}: another LibTorch is "
      "installed on the system paths. Put the prefix itself in CMAKE_PREFIX_PATH (for pip's "
      "torch: python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))') and "
      "configure a fresh build folder (docs/building.md).")
  endif()
  remat_torch_link_paths()
  remat_torch_cxx_standard()
  remat_torch_cuda_runtime()
  set(REMAT_TORCH_CUDA_MISMATCH "${REMAT_TORCH_CUDA_MISMATCH}" PARENT_SCOPE)
endfunction()

# remat_torch_pin_prefix(): before find_package(Torch). PyTorch documents its CMake files'
# folder as the prefix (torch.utils.cmake_prefix_path, site-packages/torch/share/cmake), or
# Torch_DIR as its Torch folder; TorchConfig.cmake then looks its libraries up on the system
# paths before its own lib/ folder, and where Debian's libtorch-dev is installed it found
# Debian's library for pip's headers (remat_check_torch refused that). The LibTorch that such
# a prefix names is put first in CMAKE_PREFIX_PATH, in the caller's scope: its own lib/ is then
# searched first, and the library found is the prefix's own. The first LibTorch that
# find_package would find is the one pinned; a prefix that is the torch folder itself needs
# nothing. FALLBACK_DIR, a Torch folder, is pinned where the caller names no LibTorch (an
# installed remat's rematConfig.cmake gives the one remat was built against).
#   remat_torch_pin_prefix([FALLBACK_DIR])
function(remat_torch_pin_prefix)
  set(torch_dir "${Torch_DIR}")
  if(NOT torch_dir OR NOT EXISTS "${torch_dir}/TorchConfig.cmake")
    set(torch_dir "")
    foreach(entry IN LISTS CMAKE_PREFIX_PATH)
      if(EXISTS "${entry}/share/cmake/Torch/TorchConfig.cmake")
        return()  # the torch folder itself, as docs/building.md names it
      elseif(EXISTS "${entry}/Torch/TorchConfig.cmake")
        set(torch_dir "${entry}/Torch")
        break()
      endif()
    endforeach()
  endif()
  if(NOT torch_dir AND ARGC GREATER 0 AND EXISTS "${ARGV0}/TorchConfig.cmake")
    set(torch_dir "${ARGV0}")
  endif()
  set(torch_prefix "")
  if(torch_dir)
    get_filename_component(torch_prefix "${torch_dir}/../../.." ABSOLUTE)
  endif()
  if(NOT torch_prefix OR NOT IS_DIRECTORY "${torch_prefix}/lib")
    return()
  endif()
  message(STATUS "remat: LibTorch's libraries looked up in ${torch_prefix}/lib first")
  set(CMAKE_PREFIX_PATH "${torch_prefix};${CMAKE_PREFIX_PATH}" PARENT_SCOPE)
endfunction()

# remat_torch_cuda_runtime(): after find_package(Torch), warns where the CUDA toolkit that
# LibTorch's CMake files found (CUDA_VERSION) is of another major version than the CUDA this
# LibTorch was built with (pip's torch/version.py, or the +cuXYZ of a LibTorch zip's
# build-version). Those CMake files link programs against the toolkit's CUDA runtime: a program
# then loads it beside LibTorch's own (pip's torch 2.0.1 with a CUDA 13 toolkit: libcudart.so.13
# and libcudart.so.11.0), and needs a driver recent enough for the toolkit's. It builds, and runs
# on CPU; on a GPU with an older driver, CUDA calls fail. Sets REMAT_TORCH_CUDA_MISMATCH (TRUE
# or FALSE) in the caller's scope.
function(remat_torch_cuda_runtime)
  set(REMAT_TORCH_CUDA_MISMATCH FALSE PARENT_SCOPE)
  if(NOT CUDA_VERSION MATCHES "^([0-9]+)\\.")
    return()
  endif()
  set(toolkit_major "${CMAKE_MATCH_1}")
  # The file that says which CUDA this LibTorch was built with, its line, and the version in it.
  if(EXISTS "${TORCH_INSTALL_PREFIX}/version.py")
    set(file "${TORCH_INSTALL_PREFIX}/version.py")
    set(line "^cuda[^=]*= *'[0-9]+\\.[0-9]+")
    set(version "'([0-9]+)\\.([0-9]+)")
  elseif(EXISTS "${TORCH_INSTALL_PREFIX}/build-version")
    set(file "${TORCH_INSTALL_PREFIX}/build-version")
    set(line "\\+cu[0-9]+")
    set(version "\\+cu([0-9]+)([0-9])")
  else()
    return()
  endif()
  file(STRINGS "${file}" lines REGEX "${line}")
  if(NOT lines MATCHES "${version}")
    return()
  endif()
  set(built_major "${CMAKE_MATCH_1}")
  set(built "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
  if(built_major EQUAL toolkit_major)
    return()
  endif()
  set(REMAT_TORCH_CUDA_MISMATCH TRUE PARENT_SCOPE)
  message(WARNING "remat: this LibTorch was built with CUDA ${built}, and the CUDA toolkit that "
    "its CMake files found is CUDA ${CUDA_VERSION}. They link programs against the toolkit's "
    "CUDA runtime: remat's programs and Python module will load it beside LibTorch's own, and "
    "need a GPU driver for CUDA ${toolkit_major}. Everything builds and runs on the CPU. For a GPU "
    "whose driver is older, configure a fresh build folder with a CUDA ${built_major} toolkit "
    "(CUDACXX=<its nvcc>; docs/building.md).")
endfunction()

# remat_torch_cxx_standard(): code that includes LibTorch's headers is compiled with the C++
# standard they require. remat itself is C++17, but PyTorch 2.14's headers stop with "C++20 or
# later compatible compiler is required to use ATen" under C++17, and its TorchConfig.cmake
# does not say so to the projects that use it (it sets CXX_STANDARD on the imported target,
# which applies to nothing; 2.15's asks for cxx_std_20, as done here). The standard is read
# from the check at the top of ATen/ATen.h (__cplusplus < 202002L), not from a version number,
# and asked for as a compile feature of the torch target: every target that links LibTorch,
# remat's and those of projects that use an installed remat, is then compiled as C++20.
function(remat_torch_cxx_standard)
  if(NOT TARGET torch)
    return()
  endif()
  set(header "")
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    if(EXISTS "${dir}/ATen/ATen.h")
      set(header "${dir}/ATen/ATen.h")
      break()
    endif()
  endforeach()
  if(NOT header)
    return()
  endif()
  file(STRINGS "${header}" checks REGEX "__cplusplus < [0-9]+L" LIMIT_COUNT 1)
  if(NOT checks MATCHES "__cplusplus < ([0-9]+)L")
    return()
  endif()
  set(needed "${CMAKE_MATCH_1}")
  if(needed GREATER_EQUAL 202302)
    set(feature cxx_std_23)
  elseif(needed GREATER_EQUAL 202002)
    set(feature cxx_std_20)
  else()
    return()
  endif()
  get_target_property(features torch INTERFACE_COMPILE_FEATURES)
  if(NOT features OR NOT feature IN_LIST features)
    set_property(TARGET torch APPEND PROPERTY INTERFACE_COMPILE_FEATURES ${feature})
  endif()
endfunction()

# remat_torch_link_paths(): where a program that links pip's LibTorch resolves the libraries
# that LibTorch needs in turn. pip's torch finds them at run time through its own RPATH
# ($ORIGIN/../../nvidia/<name>/lib: cuDNN, NCCL, the CUDA runtime, of the versions it was built
# with), but the linker does not expand $ORIGIN and takes the system's copies instead, when
# there are any: a CUDA toolkit's older NCCL in ld.so.conf made every program fail to link
# against PyTorch 2.15 (undefined ncclCommSuspend, ncclSignal, ...; 2026-11-27). The wheel's
# folders are given to the linker for those lookups (-rpath-link: nothing is added to the
# programs' own run path). Nothing to do for a LibTorch without the nvidia folder beside it.
function(remat_torch_link_paths)
  if(NOT TARGET torch OR APPLE OR WIN32)
    return()
  endif()
  get_filename_component(site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
  file(GLOB folders LIST_DIRECTORIES true "${site}/nvidia/*/lib")
  if(NOT folders)
    return()
  endif()
  set(paths "${TORCH_INSTALL_PREFIX}/lib")
  foreach(folder IN LISTS folders)
    if(IS_DIRECTORY "${folder}")
      list(APPEND paths "${folder}")
    endif()
  endforeach()
  list(JOIN paths ":" joined)
  get_target_property(options torch INTERFACE_LINK_OPTIONS)
  if(NOT options OR NOT "LINKER:-rpath-link,${joined}" IN_LIST options)
    set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,${joined}")
  endif()
endfunction()

# remat_torch_nvtx_hint(): before find_package(Torch). PyTorch 2.0's CMake files
# (Caffe2/public/cuda.cmake) look for CUDA's nvToolsExt library in the CUDA toolkit, which
# CUDA 12 and later no longer ship: with such a toolkit, find_package(Torch) stops
# (LIBNVTOOLSEXT NOTFOUND). pip's torch of those releases comes with the library (the
# nvidia-nvtx wheel, site-packages/nvidia/nvtx/lib), which is named to them here. Only done
# for a torch whose CMake files look for it (later releases use NVTX 3, headers only), and
# when LIBNVTOOLSEXT is not set already.
function(remat_torch_nvtx_hint)
  if(LIBNVTOOLSEXT)
    return()
  endif()
  set(prefixes ${CMAKE_PREFIX_PATH})
  if(Torch_DIR)
    get_filename_component(from_dir "${Torch_DIR}/../../.." ABSOLUTE)
    list(APPEND prefixes "${from_dir}")
  endif()
  foreach(prefix IN LISTS prefixes)
    set(cuda_cmake "${prefix}/share/cmake/Caffe2/public/cuda.cmake")
    file(GLOB library "${prefix}/../nvidia/nvtx/lib/libnvToolsExt.so*")
    if(NOT EXISTS "${cuda_cmake}" OR NOT library)
      continue()
    endif()
    file(STRINGS "${cuda_cmake}" looks REGEX "find_library\\(LIBNVTOOLSEXT")
    if(looks)
      list(GET library 0 library)
      get_filename_component(library "${library}" ABSOLUTE)
      message(STATUS "remat: nvToolsExt for this PyTorch's CMake files: ${library}")
      set(LIBNVTOOLSEXT "${library}" CACHE FILEPATH "CUDA's nvToolsExt library (PyTorch 2.0's CMake files look for it)")
      return()
    endif()
  endforeach()
endfunction()
