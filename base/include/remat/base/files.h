#pragma once
/// Writing result files so that a failure never leaves one half-written.

#include <stdexcept>
#include <string>
#include <vector>

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

/// One of the files a command writes.
struct OutputFile {
  std::string path;  // "-": standard output
  std::string text;
  std::string what = "the file";  // for messages: "the chain file", "the plot"
};

/// Writes several files as write_text_file does, all or none: every temporary is written
/// first, and only when all are complete are they renamed over their destinations; a failure
/// before that removes the temporaries and leaves every destination as it was. (Only a rename
/// that fails after an earlier one succeeded, which needs the folder to change meanwhile, can
/// leave the earlier file replaced.) Standard output ("-") is written last.
void write_text_files(const std::vector<OutputFile>& files);

/// Throws FileError, as write_text_file would, if `path` cannot be written: it exists
/// and is not a regular file, or its folder does not exist or is not writable. For commands
/// to call before long work ("-", standard output, passes).
void check_output_path(const std::string& path, const std::string& what = "the file");

}  // namespace remat
