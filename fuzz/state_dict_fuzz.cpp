// read_state_dict on any bytes: a StateDictError naming the file, or entries. Anything else (a
// crash, a sanitizer report, std::bad_alloc or another exception escaping, a bool tensor with
// a byte other than 0 and 1, an error message with a control character) is a finding.
// libFuzzer's -rss_limit_mb (scripts/fuzz.sh: 2048) makes an input that takes too much memory
// a finding too.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "findings.h"
#include "remat/models/state_dict.h"

namespace {

// One file, rewritten for each input (the reader takes a path).
const std::string& scratch_path() {
  static const std::string path = [] {
    char name[] = "/tmp/remat-fuzz-state-dict-XXXXXX";
    const int fd = mkstemp(name);
    if (fd < 0) std::abort();
    close(fd);
    return std::string(name);
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = scratch_path();
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, file) != size) std::abort();
  std::fclose(file);
  try {
    for (const remat::models::StateDictEntry& entry : remat::models::read_state_dict(path)) {
      if (!entry.tensor.defined()) __builtin_trap();
      // Every element readable: the tensor lies inside its storage.
      (void)entry.tensor.sum();
      // A bool's bytes are 0 or 1: any other is undefined behaviour when read as bool.
      if (entry.tensor.scalar_type() == at::kBool &&
          entry.tensor.view(at::kByte).gt(1).any().item<bool>())
        __builtin_trap();
    }
  } catch (const remat::models::StateDictError& error) {
    const std::string what = error.what_without_backtrace();
    if (what.rfind(path + ": ", 0) != 0) __builtin_trap();  // names the file
    // Names and keys from the file escaped: no control character reaches a terminal.
    remat::fuzz::trap_on_control_characters(what);
  }
  return 0;
}
