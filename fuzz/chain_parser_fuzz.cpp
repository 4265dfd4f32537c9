// The chain file parser on any bytes: a ChainError (bad input) or a chain that validates and
// writes back to JSON that parses to the same chain. Anything else (a crash, a sanitizer
// report, another exception) is a finding, and so are: an error message with a control
// character (a file's escape sequence would reach the terminal) or longer than 1,000 bytes
// (the file quoted whole), and a chain read from bytes with a NUL (what follows it ignored).
#include <cstddef>
#include <cstdint>
#include <string>

#include "findings.h"
#include "remat/solver/chain.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  remat::Chain chain;
  try {
    chain = remat::parse_chain(text, "fuzz");
  } catch (const remat::ChainError& error) {
    remat::fuzz::trap_unless_short_and_escaped(error.what());
    return 0;
  }
  if (text.find('\0') != std::string::npos) __builtin_trap();
  chain.validate("fuzz");
  const std::string again = remat::chain_to_json(chain);
  if (remat::chain_to_json(remat::parse_chain(again, "round trip")) != again) __builtin_trap();
  return 0;
}
