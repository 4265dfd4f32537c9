# remat_check_torch(): after find_package(Torch), refuses a LibTorch that is not whole.
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
endfunction()
