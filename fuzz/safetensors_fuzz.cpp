// read_safetensors on any bytes: a StateDictError naming the file, or entries that are the file's
// data exactly: contiguous tensors whose bytes, in the order returned, are the bytes after the
// header, to the end of the file. Anything else (a crash, a sanitizer report, std::bad_alloc or
// another exception escaping, entries that differ from the file) is a finding. libFuzzer's
// -rss_limit_mb (scripts/fuzz.sh: 2048) makes an input that takes too much memory a finding too.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "findings.h"
#include "remat/models/safetensors.h"

namespace {

// One file, rewritten for each input (the reader takes a path), removed at exit: in /dev/shm
// where there is one, since rewriting a file in /tmp took ten times as long as reading it on the
// development machine.
char scratch[64];

void remove_scratch() { std::remove(scratch); }

const char* scratch_path() {
  if (scratch[0] == '\0') {
    for (const char* folder : {"/dev/shm", "/tmp"}) {
      std::snprintf(scratch, sizeof scratch, "%s/remat-fuzz-safetensors-XXXXXX", folder);
      const int fd = mkstemp(scratch);
      if (fd < 0) continue;
      close(fd);
      std::atexit(remove_scratch);
      return scratch;
    }
    std::abort();
  }
  return scratch;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = scratch_path();
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, file) != size) std::abort();
  std::fclose(file);
  try {
    const auto entries = remat::models::read_safetensors(path);
    // Read, so the file has a header length, and the header fits in the file.
    if (size < 8) __builtin_trap();
    uint64_t header_bytes = 0;
    for (int i = 0; i < 8; ++i) header_bytes |= uint64_t{data[i]} << 8 * i;
    if (header_bytes > size - 8) __builtin_trap();
    uint64_t offset = 8 + header_bytes;
    for (const remat::models::StateDictEntry& entry : entries) {
      if (!entry.tensor.defined() || !entry.tensor.is_contiguous()) __builtin_trap();
      const auto bytes = static_cast<uint64_t>(entry.tensor.nbytes());
      if (bytes != static_cast<uint64_t>(entry.tensor.numel()) * entry.tensor.element_size() ||
          bytes > size - offset) {
        __builtin_trap();
      }
      // Compared byte by byte in this (instrumented) code: AddressSanitizer checks that the
      // tensor's memory is all there.
      if (bytes > 0 && std::memcmp(entry.tensor.data_ptr(), data + offset, bytes) != 0) {
        __builtin_trap();
      }
      offset += bytes;
    }
    if (offset != size) __builtin_trap();  // the data covered exactly
  } catch (const remat::models::StateDictError& error) {
    const std::string what = error.what_without_backtrace();
    if (what.rfind(path + ": ", 0) != 0) __builtin_trap();  // names the file
    // Names and keys from the file escaped: no control character reaches a terminal.
    remat::fuzz::trap_on_control_characters(what);
  }
  return 0;
}
