#pragma once
/// Writing result files so that a failure never leaves one half-written.

#include <string>

namespace remat {

/// Writes `text` to `path` through a temporary file next to it and a rename. Throws
/// std::runtime_error naming the path and `what` ("the chain file", "the file") on failure,
/// leaving no temporary behind.
void write_text_file(const std::string& path, const std::string& text,
                     const std::string& what = "the file");

}  // namespace remat
