#pragma once
// How finely a built-in model is cut into stages (`--granularity` on the command line).
// Finer stages give the schedule more places to keep or drop an activation; each model takes
// the granularities its registry entry lists (ModelInfo::granularities).

#include <string>

namespace remat::models {

enum class Granularity {
  /// One stage per block: a transformer block, an Inception "Mixed" block (the default).
  kBlock,
  /// Transformers: two stages per block, its attention half and its MLP half.
  kHalfBlock,
  /// Inception v3: one stage per branch of each Mixed block; the stages in between carry the
  /// block's input and the finished branches, and the last one concatenates them.
  kBranch,
};

/// "block", "half" or "branch" (what `--granularity` takes); throws c10::ValueError for
/// anything else.
Granularity parse_granularity(const std::string& text);
const char* granularity_name(Granularity granularity);

}  // namespace remat::models
