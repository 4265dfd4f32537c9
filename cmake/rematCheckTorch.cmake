# remat_check_torch(): after find_package(Torch), refuses a LibTorch that is not whole, and gives
# the linker the library folders of pip's torch (remat_torch_link_paths, below).
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
