#pragma once
// Files for read_state_dict written byte by byte, the way an attacker would: the legacy format
// around a hand-written pickle, zip archives whose central directory says what we choose, and
// deflated records made by a small fixed-Huffman encoder (a few hundred bytes that expand to
// megabytes). Nothing here uses the reader's code. Also TempFile, which holds such a file, and
// read_under_memory_limit, which reads files where an allocation must fail.

#include <sys/resource.h>
#include <sys/types.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "run_process.h"

namespace remat::test {

inline std::string le_bytes(uint64_t value, int width) {
  std::string out;
  for (int i = 0; i < width; ++i) out += static_cast<char>((value >> 8 * i) & 0xff);
  return out;
}

// Pickle pieces.
inline std::string binunicode(const std::string& text) {
  return "X" + le_bytes(text.size(), 4) + text;
}
inline std::string repeat(const std::string& piece, size_t times) {
  std::string out;
  out.reserve(piece.size() * times);
  for (size_t i = 0; i < times; ++i) out += piece;
  return out;
}

// A legacy-format file (torch.save(..., _use_new_zipfile_serialization=False)) whose main
// pickle is `main`, with no storages.
inline std::string legacy_file(const std::string& main) {
  const std::string magic = "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.";
  const std::string version = std::string("\x80\x02M") + le_bytes(1001, 2) + ".";
  const std::string sys_info = "\x80\x02}.";
  const std::string keys = "\x80\x02].";
  return magic + version + sys_info + main + keys;
}

inline uint32_t crc32(const std::string& data) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// A deflate stream (RFC 1951, one block with the fixed Huffman codes) that expands to the
// concatenation of its pieces: literal bytes, or `count` copies of the last `period` bytes
// written (count a multiple of 258, period 1 to 4).
class Deflate {
 public:
  Deflate() {
    bit(1);  // BFINAL
    bit(1);  // BTYPE 01 (fixed codes), least significant bit first
    bit(0);
  }
  Deflate& literal(const std::string& bytes) {
    for (unsigned char c : bytes) {
      if (c < 144) {
        code(0x30 + c, 8);
      } else {
        code(0x190 + c - 144, 9);
      }
    }
    plain_ += bytes;
    return *this;
  }
  Deflate& copies(size_t period, size_t count) {
    for (size_t done = 0; done < count; done += 258) {
      code(0xc5, 8);        // length code 285: 258 bytes
      code(period - 1, 5);  // distance codes 0-3: distances 1-4
      for (size_t i = 0; i < 258; ++i) plain_ += plain_[plain_.size() - period];
    }
    return *this;
  }
  // The compressed bytes, and what they expand to.
  std::pair<std::string, std::string> finish() {
    code(0, 7);  // end of block
    if (bits_ > 0) out_ += static_cast<char>(buffer_);
    return {out_, plain_};
  }

 private:
  void bit(unsigned value) {
    buffer_ |= value << bits_;
    if (++bits_ == 8) {
      out_ += static_cast<char>(buffer_);
      buffer_ = 0;
      bits_ = 0;
    }
  }
  // Huffman codes go most significant bit first.
  void code(unsigned value, int width) {
    for (int i = width - 1; i >= 0; --i) bit((value >> i) & 1u);
  }
  std::string out_;
  std::string plain_;
  unsigned buffer_ = 0;
  int bits_ = 0;
};

// A record of a zip archive, with what its central directory declares.
struct ZipRecord {
  std::string name;            // without the archive's folder
  std::string data;            // the bytes in the file
  uint16_t method = 0;         // 0 stored, 8 deflated
  uint64_t size = UINT64_MAX;  // declared decompressed size (default: data's size)
  uint32_t crc = 0;            // default: of data
  bool crc_given = false;
  int64_t header_offset = -1;  // where the central directory says it is (default: true)
};

inline ZipRecord deflated(const std::string& name, Deflate deflate) {
  auto [compressed, plain] = deflate.finish();
  ZipRecord record{name, compressed, 8, plain.size(), crc32(plain), true};
  return record;
}

// An archive "archive/<name>" per record, with the version record LibTorch's reader requires.
// With `zip64`, every size and offset is in zip64 fields, as zip writers do for files over 4 GiB.
inline std::string zip_file(std::vector<ZipRecord> records, bool zip64 = false) {
  records.insert(records.begin(), ZipRecord{"version", "3\n"});
  const uint64_t mark32 = 0xffffffff;
  std::string file;
  std::string directory;
  for (const ZipRecord& record : records) {
    const std::string name = "archive/" + record.name;
    const uint64_t size = record.size == UINT64_MAX ? record.data.size() : record.size;
    const uint32_t crc = record.crc_given ? record.crc : crc32(record.data);
    const uint64_t offset =
        record.header_offset >= 0 ? static_cast<uint64_t>(record.header_offset) : file.size();
    const auto fields = [&](uint64_t compressed, uint64_t decompressed, size_t extra) {
      return le_bytes(zip64 ? 45 : 20, 2) + le_bytes(0, 2) + le_bytes(record.method, 2) +
             le_bytes(0, 4) + le_bytes(crc, 4) + le_bytes(compressed, 4) +
             le_bytes(decompressed, 4) + le_bytes(name.size(), 2) + le_bytes(extra, 2);
    };
    if (zip64) {
      const std::string local_extra =
          le_bytes(1, 2) + le_bytes(16, 2) + le_bytes(size, 8) + le_bytes(record.data.size(), 8);
      file += "PK\x03\x04" + fields(mark32, mark32, local_extra.size()) + name + local_extra;
      const std::string extra = le_bytes(1, 2) + le_bytes(24, 2) + le_bytes(size, 8) +
                                le_bytes(record.data.size(), 8) + le_bytes(offset, 8);
      directory += "PK\x01\x02" + le_bytes(45, 2) + fields(mark32, mark32, extra.size()) +
                   le_bytes(0, 2) + le_bytes(0, 2) + le_bytes(0, 2) + le_bytes(0, 4) +
                   le_bytes(mark32, 4) + name + extra;
    } else {
      file += "PK\x03\x04" + fields(record.data.size(), size, 0) + name;
      directory += "PK\x01\x02" + le_bytes(20, 2) + fields(record.data.size(), size, 0) +
                   le_bytes(0, 2) + le_bytes(0, 2) + le_bytes(0, 2) + le_bytes(0, 4) +
                   le_bytes(offset, 4) + name;
    }
    file += record.data;
  }
  const uint64_t directory_offset = file.size();
  file += directory;
  if (zip64) {
    const uint64_t record_offset = file.size();
    file += "PK\x06\x06" + le_bytes(44, 8) + le_bytes(45, 2) + le_bytes(45, 2) + le_bytes(0, 4) +
            le_bytes(0, 4) + le_bytes(records.size(), 8) + le_bytes(records.size(), 8) +
            le_bytes(directory.size(), 8) + le_bytes(directory_offset, 8);
    file += "PK\x06\x07" + le_bytes(0, 4) + le_bytes(record_offset, 8) + le_bytes(1, 4);
    file += "PK\x05\x06" + le_bytes(0, 2) + le_bytes(0, 2) + le_bytes(0xffff, 2) +
            le_bytes(0xffff, 2) + le_bytes(mark32, 4) + le_bytes(mark32, 4) + le_bytes(0, 2);
  } else {
    file += "PK\x05\x06" + le_bytes(0, 2) + le_bytes(0, 2) + le_bytes(records.size(), 2) +
            le_bytes(records.size(), 2) + le_bytes(directory.size(), 4) +
            le_bytes(directory_offset, 4) + le_bytes(0, 2);
  }
  return file;
}

// A pickle (protocol 2) of {"w": tensor([1.5, -2.0])} on storage "0", whose bytes are
// kTwoFloats.
inline std::string two_floats_pickle() {
  return "\x80\x02}" + binunicode("w") + "ctorch._utils\n_rebuild_tensor_v2\n(" + "(" +
         binunicode("storage") + "ctorch\nFloatStorage\n" + binunicode("0") + binunicode("cpu") +
         "K\x02tQ" + std::string("K\0", 2) + "K\x02\x85" + "K\x01\x85" + "\x89" +
         "ccollections\nOrderedDict\n)R" + "tRs.";
}
inline const std::string kTwoFloats = std::string("\x00\x00\xc0\x3f\x00\x00\x00\xc0", 8);

// A file holding `bytes`, extended with zeros to `size` bytes without writing them (a sparse
// file), removed at the end of the test.
class TempFile {
 public:
  explicit TempFile(const std::string& bytes, uint64_t size = 0) {
    char name[] = "/tmp/remat-hostile-XXXXXX";
    const int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    close(fd);
    path_ = name;
    std::ofstream(path_, std::ios::binary).write(bytes.data(), static_cast<long>(bytes.size()));
    if (size > bytes.size()) REQUIRE(truncate(path_.c_str(), static_cast<off_t>(size)) == 0);
  }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---- Reading where an allocation must fail ----
//
// A test that an allocation failing inside a reader becomes the reader's error lowers the
// address-space limit to a little above what the process maps, so that a large allocation
// cannot be mapped. But malloc also reuses free memory already mapped: what earlier test
// cases of the same process freed stays in its heap, and an allocation the limit should refuse
// may then succeed, depending on which test cases ran before (a whole test program run at
// once, as tools/mutate.py does, differs from ctest's one process per test case). So the reads
// run in a fresh process of this test program: the hidden test case `child` (tagged "[.]"),
// told the files in REMAT_CHILD_FILES (one path per line) and where to write in
// REMAT_CHILD_OUT, calls under_memory_limit_child().

// In the child: reads each file of REMAT_CHILD_FILES with `read` under an address-space limit
// of 64 MiB above what the process maps now, and writes one line per file to REMAT_CHILD_OUT:
// the error's message, "(no error)" or "escaped: " and what escaped.
template <typename Error, typename Read>
void under_memory_limit_child(Read read) {
  const char* files = std::getenv("REMAT_CHILD_FILES");
  const char* out = std::getenv("REMAT_CHILD_OUT");
  if (files == nullptr || out == nullptr) FAIL("run by read_under_memory_limit() only");
  std::vector<std::string> paths;
  std::istringstream lines(files);
  for (std::string line; std::getline(lines, line);) paths.push_back(line);
  rlimit old{};
  REQUIRE(getrlimit(RLIMIT_AS, &old) == 0);
  long pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  REQUIRE(pages > 0);
  std::vector<std::string> errors;
  errors.reserve(paths.size());
  rlimit tight = old;
  tight.rlim_cur = static_cast<rlim_t>(pages) * sysconf(_SC_PAGESIZE) + (rlim_t{64} << 20);
  REQUIRE(setrlimit(RLIMIT_AS, &tight) == 0);
  for (const std::string& path : paths) {
    try {
      read(path);
      errors.emplace_back("(no error)");
    } catch (const Error& e) {
      errors.emplace_back(e.what());
    } catch (const std::exception& e) {
      errors.emplace_back(std::string("escaped: ") + e.what());
    }
  }
  REQUIRE(setrlimit(RLIMIT_AS, &old) == 0);
  std::ofstream file(out);
  for (std::string& e : errors) {
    for (char& c : e)
      if (c == '\n') c = ' ';
    file << e << '\n';
  }
}

// In the test: runs the hidden test case `child` of this program in a fresh process on
// `paths` and returns its lines, one per file (under_memory_limit_child).
inline std::vector<std::string> read_under_memory_limit(const std::string& child,
                                                        const std::vector<std::string>& paths) {
  char out_name[] = "/tmp/remat-child-XXXXXX";
  const int fd = mkstemp(out_name);
  REQUIRE(fd >= 0);
  close(fd);
  const std::string out = out_name;
  std::string files;
  for (const std::string& p : paths) files += p + "\n";
  const RunResult run = run_process("/proc/self/exe", "this test program", {child},
                                    {"REMAT_CHILD_FILES=" + files, "REMAT_CHILD_OUT=" + out});
  INFO(describe(run));
  REQUIRE(run.exit_code == 0);
  std::vector<std::string> lines;
  std::ifstream in(out);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::remove(out.c_str());
  return lines;
}

}  // namespace remat::test
