#pragma once
// What every target counts as a finding in an error message (docs/reliability.md, "Fuzzing").

#include <cstddef>
#include <string>

namespace remat::fuzz {

// A control character in a message: a file's escape sequence would reach the terminal.
inline void trap_on_control_characters(const std::string& message) {
  for (const char c : message)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) __builtin_trap();
}

// A parser's message: escaped, and at most 1,000 bytes (not the file quoted whole).
inline void trap_unless_short_and_escaped(const std::string& message) {
  if (message.size() > 1000) __builtin_trap();
  trap_on_control_characters(message);
}

}  // namespace remat::fuzz
