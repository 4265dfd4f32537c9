#pragma once
/// Writing result files so that a failure never leaves one half-written.

#include <stdexcept>
#include <string>

namespace remat {

/// A file that cannot be written: the message names it and says why. Bad input or an
/// unwritable place, not a bug (the CLI exits with code 2).
class FileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Writes `text` to `path` ("-": standard output) through a temporary file in the same
/// folder and a rename, so that readers see the old file or the new one, never half of one.
/// The temporary is made by mkstemp (an unpredictable name, created exclusively: never through
/// a link someone planted); the rename replaces the destination. A destination that exists
/// and is not a regular file (a directory, a symbolic link, a FIFO, a device) is refused. The
/// new file gets the old one's permissions, or those of a new file under the umask. Throws
/// FileError naming the path and `what` ("the chain file", "the file") on failure,
/// leaving no temporary behind; a failed write to standard output throws too.
void write_text_file(const std::string& path, const std::string& text,
                     const std::string& what = "the file");

/// Throws FileError, as write_text_file would, if `path` cannot be written: it exists
/// and is not a regular file, or its folder does not exist or is not writable. For commands
/// to call before long work ("-", standard output, passes).
void check_output_path(const std::string& path, const std::string& what = "the file");

}  // namespace remat
