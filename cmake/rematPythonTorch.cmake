# Where the torch of the Python that builds the package is, for find_package(Torch): the
# package is built against the torch its users have installed, whatever its version.
#
# pip builds in an isolated environment (PEP 517 build isolation): a fresh site-packages with
# the build requirements only, put in front by PYTHONPATH, and PYTHONNOUSERSITE set. torch is
# not a build requirement (pip would download another copy, perhaps of another version, and
# the extension would then not load against the installed one), so when the build's Python
# cannot import torch, the same interpreter is asked again without those two variables: that
# is the environment `pip install .` was run in. `pip install --no-build-isolation .` needs
# no second try.
function(remat_find_python_torch)
  if(Torch_DIR)
    return()
  endif()
  find_package(Python 3.9 REQUIRED COMPONENTS Interpreter)
  set(probe "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__)")
  execute_process(COMMAND "${Python_EXECUTABLE}" -c "${probe}"
                  OUTPUT_VARIABLE out RESULT_VARIABLE rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE
                            "${Python_EXECUTABLE}" -c "${probe}"
                    OUTPUT_VARIABLE out RESULT_VARIABLE rc ERROR_VARIABLE err
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
  endif()
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "remat: the Python package is built against the installed torch, but "
      "${Python_EXECUTABLE} cannot import torch:\n${err}\nInstall PyTorch first "
      "(pip install torch), in the environment you install remat into.")
  endif()
  string(REPLACE "\n" ";" lines "${out}")
  list(GET lines 0 prefix)
  list(GET lines 1 version)
  message(STATUS "remat: building the Python package against torch ${version} at ${prefix}")
  set(REMAT_PYTHON_TORCH_PREFIX "${prefix}" PARENT_SCOPE)
  set(REMAT_PYTHON_TORCH_VERSION "${version}" PARENT_SCOPE)
  set(CMAKE_PREFIX_PATH "${prefix};${CMAKE_PREFIX_PATH}" PARENT_SCOPE)
endfunction()
