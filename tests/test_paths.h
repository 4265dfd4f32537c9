#pragma once
// The absolute paths a test program needs, each defined in a source that tests/CMakeLists.txt
// generates for that program alone (remat_test_paths): the paths differ from clone to clone, and
// as definitions on the command line they made every source of the program miss ccache in a
// fresh clone (scripts/ccache.sh); so only the generated file does. A program uses those its
// CMake target names; any other is a link error.
namespace remat::test_paths {
extern const char* const source_dir;               ///< the repository's root
extern const char* const remat_executable;         ///< the `remat` program (CLI tests)
extern const char* const dp_worker;                ///< remat_dp_worker (data-parallel tests)
extern const char* const torchvision_reference_dir;   ///< files from torchvision (models tests)
extern const char* const state_dict_dir;              ///< state dicts written by torch
extern const char* const transformers_reference_dir;  ///< files from Hugging Face's GPT-2
}  // namespace remat::test_paths
