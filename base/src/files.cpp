#include "remat/base/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace remat {
namespace {

std::string error_text(int error) { return std::strerror(error); }

// What kind of file `mode` describes, for a message.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string directory_of(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_name(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

void write_all(int fd, const std::string& text, const std::string& path, const std::string& what) {
  const char* data = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw FileError(path + ": writing " + what + " failed: " + error_text(errno));
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
}

// Checks that `path` can be written, as check_output_path documents; returns the permissions
// of the regular file already there, if any.
std::optional<mode_t> inspect_destination(const std::string& path, const std::string& what) {
  if (path.empty()) throw FileError("an empty path for " + what);
  std::optional<mode_t> existing;
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode))
      throw FileError(path + ": cannot write " + what + " there: it is " + kind_of(st.st_mode) +
                      ", not a regular file");
    // Its permissions, but not set-user-ID, set-group-ID or sticky: a chain or a picture
    // written over a program must not become one that runs as its owner.
    existing = st.st_mode & 0777;
  } else if (errno != ENOENT) {
    throw FileError(path + ": cannot write " + what + ": " + error_text(errno));
  }
  const std::string directory = directory_of(path);
  struct stat dir {};
  if (::stat(directory.c_str(), &dir) != 0)
    throw FileError(path + ": cannot write " + what + ": the folder " + directory + " " +
                    (errno == ENOENT ? std::string("does not exist") : error_text(errno)));
  if (!S_ISDIR(dir.st_mode))
    throw FileError(path + ": cannot write " + what + ": " + directory + " is not a folder");
  if (::access(directory.c_str(), W_OK | X_OK) != 0)
    throw FileError(path + ": cannot write " + what + ": the folder " + directory +
                    " is not writable");
  return existing;
}

// A temporary of an unpredictable name, created exclusively in the destination's folder
// (mkstemp: O_CREAT | O_EXCL, so never through a link someone planted): its descriptor and name.
std::pair<int, std::string> make_temporary(const std::string& path, const std::string& what) {
  std::string pattern = directory_of(path) + "/." + base_name(path) + ".remat-XXXXXX";
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  const int fd = ::mkstemp(name.data());
  if (fd < 0) throw FileError(path + ": cannot write " + what + ": " + error_text(errno));
  return {fd, std::string(name.data())};
}

}  // namespace

void check_output_path(const std::string& path, const std::string& what) {
  if (path == "-") return;
  inspect_destination(path, what);
  // The folder's permissions are not the whole story (a read-only or special file system such
  // as /sys or /proc, where even root's access() check passes): create the temporary the
  // write will create, and remove it.
  const auto [fd, temporary] = make_temporary(path, what);
  ::close(fd);
  ::unlink(temporary.c_str());
}

namespace {

// Writes `text` into a new temporary beside `path` (see write_text_file) and returns its name;
// nothing is left behind on failure.
std::string write_temporary(const std::string& path, const std::string& text,
                            const std::string& what) {
  const std::optional<mode_t> existing = inspect_destination(path, what);
  // Renamed over the destination once written, which replaces a planted link rather than
  // following it.
  const auto [fd, temporary] = make_temporary(path, what);
  bool open = true;
  try {
    // mkstemp makes the file readable by its owner only; give it the destination's
    // permissions, or what a new file would get (umask can only be read by setting it: a
    // thread creating a file in between would get 0 as its mask).
    mode_t mode = 0;
    if (existing) {
      mode = *existing;
    } else {
      const mode_t mask = ::umask(0);
      ::umask(mask);
      mode = 0666 & ~mask;
    }
    if (::fchmod(fd, mode) != 0)
      throw FileError(path + ": cannot write " + what + ": " + error_text(errno));
    write_all(fd, text, path, what);
    if (::fsync(fd) != 0)
      throw FileError(path + ": writing " + what + " failed: " + error_text(errno));
    open = false;
    if (::close(fd) != 0)
      throw FileError(path + ": writing " + what + " failed: " + error_text(errno));
  } catch (...) {
    if (open) ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  return temporary;
}

void write_stdout(const std::string& text, const std::string& what) {
  // Standard output: a failed write (a full disk, a closed pipe) is an error too.
  std::fflush(stdout);
  write_all(STDOUT_FILENO, text, "standard output", what);
}

}  // namespace

void write_text_file(const std::string& path, const std::string& text, const std::string& what) {
  write_text_files({{path, text, what}});
}

void write_text_files(const std::vector<OutputFile>& files) {
  // Every temporary first: a failure there removes those made and leaves the destinations
  // untouched.
  std::vector<std::string> temporaries;
  try {
    for (const OutputFile& file : files) {
      if (file.path != "-") temporaries.push_back(write_temporary(file.path, file.text, file.what));
    }
  } catch (...) {
    for (const std::string& temporary : temporaries) ::unlink(temporary.c_str());
    throw;
  }
  std::size_t next = 0;
  for (const OutputFile& file : files) {
    if (file.path == "-") continue;
    const std::string& temporary = temporaries[next++];
    if (std::rename(temporary.c_str(), file.path.c_str()) != 0) {
      const int error = errno;
      for (std::size_t k = next - 1; k < temporaries.size(); ++k) ::unlink(temporaries[k].c_str());
      throw FileError(file.path + ": cannot replace " + file.what + ": " + error_text(error));
    }
  }
  // Standard output last: it cannot be taken back.
  for (const OutputFile& file : files) {
    if (file.path == "-") write_stdout(file.text, file.what);
  }
}

}  // namespace remat
