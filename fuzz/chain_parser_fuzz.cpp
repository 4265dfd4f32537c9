// The chain file parser on any bytes: a ChainError (bad input) or a chain that validates and
// writes back to JSON that parses to the same chain. Anything else (a crash, a sanitizer
// report, another exception) is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "remat/solver/chain.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  remat::Chain chain;
  try {
    chain = remat::parse_chain(text, "fuzz");
  } catch (const remat::ChainError&) {
    return 0;
  }
  chain.validate("fuzz");
  const std::string again = remat::chain_to_json(chain);
  if (remat::chain_to_json(remat::parse_chain(again, "round trip")) != again) __builtin_trap();
  return 0;
}
