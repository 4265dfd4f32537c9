#include "remat/models/safetensors.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <nlohmann/json.hpp>
#include <unordered_set>
#include <utility>

#include "remat/base/text.h"

// The checks follow the reference implementation (the Rust crate's SafeTensors::read_metadata and
// Metadata::validate): the header length at most MAX_HEADER_SIZE and inside the file; the header
// UTF-8 JSON; each tensor's byte count its shape's product times its dtype's size, with overflow
// checked; the byte ranges, sorted by (begin, end), following one another without holes or
// overlap from 0 to the end of the file. Beyond the crate: duplicate names and fields are
// refused (serde keeps one of them silently), nesting is limited before parsing, shapes have at
// most 64 dimensions and a product that fits int64 even for empty tensors (LibTorch's sizes and
// strides are int64), and BOOL bytes are 0 or 1 (anything else is undefined behaviour in C++).

namespace remat::models {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the Rust crate's MAX_HEADER_SIZE
constexpr int kMaxDepth = 64;                      // JSON nesting; a valid header needs 3
constexpr size_t kMaxDims = 64;
constexpr size_t kMaxNameInMessage = 200;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  // Names and keys from the file, escaped: a NUL would cut the message short, and an escape
  // sequence would reach the terminal.
  throw StateDictError(printable(path + ": " + what));
}

// A name from the file as messages show it: quoted, and cut (at a UTF-8 boundary) when long.
std::string named(const std::string& name) { return quoted(name, kMaxNameInMessage); }

struct Dtype {
  const char* name;
  c10::ScalarType type;
  int64_t itemsize;
};

// The format's dtypes that LibTorch 1.13 has. F8_E5M2, F8_E4M3 and U16/U32/U64 (torch >= 2.1 and
// 2.3) are refused by name.
constexpr Dtype kDtypes[] = {
    {"BOOL", c10::ScalarType::Bool, 1}, {"U8", c10::ScalarType::Byte, 1},
    {"I8", c10::ScalarType::Char, 1},   {"I16", c10::ScalarType::Short, 2},
    {"I32", c10::ScalarType::Int, 4},   {"I64", c10::ScalarType::Long, 8},
    {"F16", c10::ScalarType::Half, 2},  {"BF16", c10::ScalarType::BFloat16, 2},
    {"F32", c10::ScalarType::Float, 4}, {"F64", c10::ScalarType::Double, 8},
};

const Dtype* find_dtype(const std::string& name) {
  for (const Dtype& dtype : kDtypes) {
    if (name == dtype.name) return &dtype;
  }
  return nullptr;
}

std::string supported_dtypes() {
  std::string out;
  for (const Dtype& dtype : kDtypes) out += (out.empty() ? "" : ", ") + std::string(dtype.name);
  return out;
}

std::string list(const std::vector<uint64_t>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + "]";
}

bool little_endian_host() {
  const uint16_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

// The file, read with pread at given offsets. Only regular files: a FIFO or a device has no
// size to check the header against (and a FIFO would block open without O_NONBLOCK).
class File {
 public:
  explicit File(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
    struct stat info {};
    if (::fstat(fd_, &info) != 0) {
      const int error = errno;
      ::close(fd_);
      fail(path, std::string("cannot stat: ") + std::strerror(error));
    }
    if (!S_ISREG(info.st_mode)) {
      ::close(fd_);
      fail(path, "not a regular file");
    }
    size_ = static_cast<uint64_t>(info.st_size);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() { ::close(fd_); }

  uint64_t size() const { return size_; }

  // `count` bytes at `offset` into `out`; `what` names them for the message.
  void read(uint64_t offset, void* out, uint64_t count, const std::string& what) const {
    auto* bytes = static_cast<char*>(out);
    while (count > 0) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(count, 1u << 30));
      const ssize_t got = ::pread(fd_, bytes, chunk, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        fail(path_, "cannot read " + what + " at byte " + std::to_string(offset) + ": " +
                        std::strerror(errno));
      }
      if (got == 0) {
        fail(path_, "the file ended at byte " + std::to_string(offset) + " while reading " + what +
                        " (did it change while being read?)");
      }
      bytes += got;
      offset += static_cast<uint64_t>(got);
      count -= static_cast<uint64_t>(got);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// What nlohmann's parser would take too far or accept where the crate's serde_json refuses,
// refused before parsing, with where:
//  - nesting: the parser keeps its stack on the heap, but a header nested a million deep is not
//    a header. Brackets inside strings do not count; on invalid JSON the count may go wrong only
//    after the first error, where the parser stops anyway.
//  - a NUL byte, which the lexer takes for the end of the input, ignoring what follows. JSON has
//    none anywhere (a string writes it \u0000).
//  - a UTF-8 byte-order mark, which the parser skips.
void prescan(const std::string& header, const std::string& path) {
  const auto invalid = [&](size_t i, const std::string& what) {
    fail(path, "the header is not valid JSON at byte " + std::to_string(8 + i) + ": " + what);
  };
  if (header.compare(0, 3, "\xef\xbb\xbf") == 0) invalid(0, "a byte-order mark");
  const size_t nul = header.find('\0');
  if (nul != std::string::npos) invalid(nul, "a NUL byte");
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < header.size(); ++i) {
    const char c = header[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth) {
        fail(path, "the header nests JSON more than " + std::to_string(kMaxDepth) +
                       " levels deep at byte " + std::to_string(8 + i));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

// One tensor as the header declares it, in header order.
struct TensorInfo {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  std::vector<uint64_t> offsets;
  bool has_dtype = false;
  bool has_shape = false;
  bool has_offsets = false;
};

// Reads the header as nlohmann's SAX events, straight into TensorInfos: no JSON document is
// built, and the duplicate keys that a document would silently merge are seen.
class HeaderReader {
 public:
  using json = nlohmann::json;

  explicit HeaderReader(const std::string& path) : path_(path) {}

  std::vector<TensorInfo>& tensors() { return tensors_; }

  bool null() { return value(Kind::kNull, "null"); }
  bool boolean(bool b) { return value(Kind::kOther, b ? "true" : "false"); }
  bool number_integer(json::number_integer_t n) {
    // Only numbers written with a minus sign come here, -0 included (serde_json reads -0 as a
    // float, which the crate refuses as a size).
    return value(Kind::kOther, "the number " + (n == 0 ? "-0" : std::to_string(n)));
  }
  bool number_unsigned(json::number_unsigned_t n) {
    return value(Kind::kUnsigned, "the number " + std::to_string(n), n);
  }
  bool number_float(json::number_float_t, const json::string_t& text) {
    return value(Kind::kOther, "the number " + text);
  }
  bool string(json::string_t& text) { return value(Kind::kString, "a string", 0, &text); }
  bool binary(json::binary_t&) { return value(Kind::kOther, "binary data"); }  // not in JSON
  bool start_object(size_t) { return value(Kind::kObject, "an object"); }
  bool start_array(size_t) { return value(Kind::kArray, "an array"); }
  bool end_object() { return end(); }
  bool end_array() { return end(); }

  bool key(json::string_t& key) {
    switch (frames_.back()) {
      case Frame::kRoot:
        if (!keys_.insert(key).second) {
          fail(path_, key == kMetadataKey ? "the header has two \"__metadata__\" entries"
                                          : "tensor " + named(key) + " is named twice");
        }
        key_ = std::move(key);
        break;
      case Frame::kMetadata:
        if (!metadata_keys_.insert(key).second) {
          fail(path_, "\"__metadata__\" names " + named(key) + " twice");
        }
        key_ = std::move(key);
        break;
      case Frame::kTensor: {
        TensorInfo& tensor = tensors_.back();
        bool* seen = key == "dtype"          ? &tensor.has_dtype
                     : key == "shape"        ? &tensor.has_shape
                     : key == "data_offsets" ? &tensor.has_offsets
                                             : nullptr;
        if (seen != nullptr && *seen) {
          fail(path_, "tensor " + named(tensor.name) + " has two \"" + key + "\" fields");
        }
        if (seen != nullptr) *seen = true;
        field_ = seen == &tensor.has_dtype     ? Field::kDtype
                 : seen == &tensor.has_shape   ? Field::kShape
                 : seen == &tensor.has_offsets ? Field::kOffsets
                                               : Field::kIgnored;
        break;
      }
      default:  // inside a field the format does not know: ignored, as the crate does
        break;
    }
    return true;
  }

  bool parse_error(size_t position, const std::string&, const json::exception& error) {
    // "[json.exception.parse_error.101] parse error at line 1, column 9: syntax error ..."
    const std::string what = error.what();
    const size_t colon = what.find(": ");
    const std::string problem = colon == std::string::npos ? what : what.substr(colon + 2);
    fail(path_, "the header is not valid JSON at byte " +
                    std::to_string(8 + (position > 0 ? position - 1 : 0)) + ": " + problem);
  }

 private:
  static constexpr const char* kMetadataKey = "__metadata__";
  enum class Kind { kObject, kArray, kString, kUnsigned, kNull, kOther };
  // Where a value is: which object or array holds it.
  enum class Frame { kRoot, kMetadata, kTensor, kShape, kOffsets, kIgnored };
  enum class Field { kDtype, kShape, kOffsets, kIgnored };

  std::string in_tensor() const { return "tensor " + named(tensors_.back().name); }

  // Every value, container or not: checked against where it is, and for a container, entered.
  bool value(Kind kind, const std::string& described, uint64_t number = 0,
             std::string* text = nullptr) {
    const auto open = [&](Frame frame) {
      if (kind == Kind::kObject || kind == Kind::kArray) frames_.push_back(frame);
    };
    if (frames_.empty()) {
      if (kind != Kind::kObject) fail(path_, "the header is " + described + ", not a JSON object");
      frames_.push_back(Frame::kRoot);
      return true;
    }
    switch (frames_.back()) {
      case Frame::kRoot:
        if (key_ == kMetadataKey) {
          // null is what serde reads as no metadata.
          if (kind != Kind::kObject && kind != Kind::kNull) {
            fail(path_, "\"__metadata__\" is " + described + ", not an object of strings");
          }
          open(Frame::kMetadata);
        } else {
          if (kind != Kind::kObject) {
            fail(path_, "tensor " + named(key_) + " is " + described +
                            ", not an object with dtype, shape and data_offsets");
          }
          tensors_.emplace_back();
          tensors_.back().name = key_;
          frames_.push_back(Frame::kTensor);
        }
        break;
      case Frame::kMetadata:
        if (kind != Kind::kString) {
          fail(path_,
               "\"__metadata__\" entry " + named(key_) + " is " + described + ", not a string");
        }
        break;
      case Frame::kTensor:
        switch (field_) {
          case Field::kDtype:
            if (kind != Kind::kString) fail(path_, in_tensor() + ": dtype is " + described);
            tensors_.back().dtype = std::move(*text);
            break;
          case Field::kShape:
          case Field::kOffsets:
            if (kind != Kind::kArray) {
              fail(path_, in_tensor() + ": " +
                              (field_ == Field::kShape ? "shape" : "data_offsets") + " is " +
                              described + ", not an array");
            }
            frames_.push_back(field_ == Field::kShape ? Frame::kShape : Frame::kOffsets);
            break;
          case Field::kIgnored:
            open(Frame::kIgnored);
            break;
        }
        break;
      case Frame::kShape: {
        std::vector<uint64_t>& shape = tensors_.back().shape;
        if (kind != Kind::kUnsigned) {
          fail(path_, in_tensor() + ": shape[" + std::to_string(shape.size()) + "] is " +
                          described + ", not a size (an integer >= 0)");
        }
        if (shape.size() == kMaxDims) {
          fail(path_, in_tensor() + ": the shape has more than " + std::to_string(kMaxDims) +
                          " dimensions");
        }
        shape.push_back(number);
        break;
      }
      case Frame::kOffsets: {
        std::vector<uint64_t>& offsets = tensors_.back().offsets;
        if (kind != Kind::kUnsigned) {
          fail(path_, in_tensor() + ": data_offsets[" + std::to_string(offsets.size()) + "] is " +
                          described + ", not a byte offset (an integer >= 0)");
        }
        if (offsets.size() == 2) fail(path_, in_tensor() + ": data_offsets has more than 2 values");
        offsets.push_back(number);
        break;
      }
      case Frame::kIgnored:
        open(Frame::kIgnored);
        break;
    }
    return true;
  }

  bool end() {
    frames_.pop_back();
    return true;
  }

  std::string path_;
  std::vector<Frame> frames_;
  std::string key_;  // the last key in the root or the metadata
  Field field_ = Field::kIgnored;
  std::unordered_set<std::string> keys_;
  std::unordered_set<std::string> metadata_keys_;
  std::vector<TensorInfo> tensors_;
};

// A tensor checked against its header entry and the file, ready to allocate.
struct Planned {
  const TensorInfo* info;
  const Dtype* dtype;
  std::vector<int64_t> sizes;
  uint64_t begin;
  uint64_t end;
};

Planned plan(const TensorInfo& tensor, uint64_t data_bytes, const std::string& path) {
  const std::string what = "tensor " + named(tensor.name);
  if (!tensor.has_dtype) fail(path, what + " has no dtype");
  if (!tensor.has_shape) fail(path, what + " has no shape");
  if (!tensor.has_offsets) fail(path, what + " has no data_offsets");
  const Dtype* dtype = find_dtype(tensor.dtype);
  if (dtype == nullptr) {
    fail(path, what + ": dtype " + named(tensor.dtype) + " is not supported (remat reads " +
                   supported_dtypes() + ")");
  }
  // The product of the sizes, zeros counted as ones: LibTorch computes strides from it even
  // for an empty tensor, so it must fit int64 too.
  Planned planned{&tensor, dtype, {}, 0, 0};
  int64_t product = dtype->itemsize;
  bool empty = false;
  for (const uint64_t size : tensor.shape) {
    if (size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(product, std::max<int64_t>(static_cast<int64_t>(size), 1),
                               &product)) {
      fail(path,
           what + ": shape " + list(tensor.shape) + " of " + dtype->name + " overflows 64 bits");
    }
    empty = empty || size == 0;
    planned.sizes.push_back(static_cast<int64_t>(size));
  }
  const uint64_t bytes = empty ? 0 : static_cast<uint64_t>(product);
  if (tensor.offsets.size() != 2) {
    fail(path, what + ": data_offsets " + list(tensor.offsets) + " is not [begin, end]");
  }
  planned.begin = tensor.offsets[0];
  planned.end = tensor.offsets[1];
  const std::string offsets = "data_offsets " + list(tensor.offsets);
  if (planned.end < planned.begin) fail(path, what + ": " + offsets + " end before they begin");
  if (planned.end > data_bytes) {
    fail(path, what + ": " + offsets + " go beyond the end of the file, whose data holds " +
                   std::to_string(data_bytes) + " bytes (a truncated download?)");
  }
  if (planned.end - planned.begin != bytes) {
    fail(path, what + ": shape " + list(tensor.shape) + " of " + dtype->name + " is " +
                   std::to_string(bytes) + " bytes, " + offsets + " hold " +
                   std::to_string(planned.end - planned.begin));
  }
  return planned;
}

// The byte ranges, sorted, must cover the data exactly, as the crate's Metadata::validate
// requires: no hole, no overlap, nothing after the last.
void check_coverage(const std::vector<Planned>& sorted, uint64_t data_start, uint64_t data_bytes,
                    const std::string& path) {
  const auto file_bytes = [&](uint64_t from, uint64_t to) {
    return " (file bytes " + std::to_string(data_start + from) + " to " +
           std::to_string(data_start + to) + ")";
  };
  uint64_t covered = 0;
  const Planned* previous = nullptr;
  for (const Planned& tensor : sorted) {
    const std::string what = "tensor " + named(tensor.info->name);
    if (tensor.begin > covered) {
      fail(path, "bytes " + std::to_string(covered) + " to " + std::to_string(tensor.begin) +
                     " of the data" + file_bytes(covered, tensor.begin) +
                     " belong to no tensor: a hole " +
                     (previous ? "between tensor " + named(previous->info->name) + " and "
                               : std::string("before ")) +
                     what);
    }
    if (tensor.begin < covered) {
      fail(path, what + " (data_offsets " + list(tensor.info->offsets) + ") overlaps tensor " +
                     named(previous->info->name) + " (data_offsets " +
                     list(previous->info->offsets) + ")");
    }
    covered = tensor.end;
    previous = &tensor;
  }
  if (covered != data_bytes) {
    fail(path, std::to_string(data_bytes - covered) + " bytes after the last tensor" +
                   file_bytes(covered, data_bytes) + " belong to no tensor");
  }
}

std::vector<StateDictEntry> read(const std::string& path) {
  if (!little_endian_host()) {
    fail(path,
         "safetensors files are little-endian, and remat reads them on little-endian "
         "machines only");
  }
  const File file(path);
  if (file.size() < 8) {
    fail(path, "truncated: the file has " + std::to_string(file.size()) +
                   " bytes, fewer than the 8 of the header length");
  }
  unsigned char prefix[8];
  file.read(0, prefix, 8, "the header length");
  uint64_t header_bytes = 0;
  for (int i = 0; i < 8; ++i) header_bytes |= uint64_t{prefix[i]} << 8 * i;
  if (header_bytes > kMaxHeaderBytes) {
    fail(path, "the header length at byte 0 (" + std::to_string(header_bytes) +
                   ") is over the format's limit of " + std::to_string(kMaxHeaderBytes) +
                   " bytes (not a safetensors file?)");
  }
  if (header_bytes > file.size() - 8) {
    fail(path, "the header length at byte 0 (" + std::to_string(header_bytes) +
                   ") goes beyond the end of the file (" + std::to_string(file.size()) +
                   " bytes): truncated, or not a safetensors file");
  }
  std::string header;
  try {
    header.resize(header_bytes);
  } catch (const std::bad_alloc&) {
    fail(path, "out of memory for the header (" + std::to_string(header_bytes) + " bytes)");
  }
  file.read(8, header.data(), header_bytes, "the header");
  prescan(header, path);
  HeaderReader reader(path);
  // Errors throw from the reader's callbacks, which otherwise accept.
  const bool parsed = nlohmann::json::sax_parse(header.begin(), header.end(), &reader);
  if (!parsed) fail(path, "the header is not valid JSON (this is a bug in remat: no message)");
  header = std::string();  // its memory back before the tensors take theirs

  const uint64_t data_start = 8 + header_bytes;
  const uint64_t data_bytes = file.size() - data_start;
  std::vector<Planned> sorted;
  sorted.reserve(reader.tensors().size());
  for (const TensorInfo& tensor : reader.tensors())
    sorted.push_back(plan(tensor, data_bytes, path));
  std::stable_sort(sorted.begin(), sorted.end(), [](const Planned& a, const Planned& b) {
    return std::make_pair(a.begin, a.end) < std::make_pair(b.begin, b.end);
  });
  check_coverage(sorted, data_start, data_bytes, path);

  // Every size is checked: together the tensors take the data's size, at most the file's.
  std::vector<StateDictEntry> entries;
  entries.reserve(sorted.size());
  for (const Planned& planned : sorted) {
    const std::string what = "tensor " + named(planned.info->name);
    const uint64_t bytes = planned.end - planned.begin;
    torch::Tensor tensor;
    try {
      tensor = torch::empty(planned.sizes, torch::TensorOptions().dtype(planned.dtype->type));
    } catch (const std::bad_alloc&) {
      fail(path,
           "cannot allocate " + what + " (" + std::to_string(bytes) + " bytes): out of memory");
    } catch (const c10::Error& e) {  // LibTorch's allocator reports failure so
      fail(path, "cannot allocate " + what + " (" + std::to_string(bytes) +
                     " bytes): " + e.what_without_backtrace());
    }
    if (bytes == 0) {
      entries.push_back({planned.info->name, std::move(tensor)});
      continue;
    }
    file.read(data_start + planned.begin, tensor.data_ptr(), bytes, what);
    if (planned.dtype->type == c10::ScalarType::Bool) {
      const auto* values = static_cast<const unsigned char*>(tensor.data_ptr());
      for (uint64_t i = 0; i < bytes; ++i) {
        if (values[i] > 1) {
          fail(path, what + " (BOOL) holds " + std::to_string(values[i]) + " at byte " +
                         std::to_string(data_start + planned.begin + i) +
                         "; a BOOL byte is 0 or 1");
        }
      }
    }
    entries.push_back({planned.info->name, std::move(tensor)});
  }
  return entries;
}

}  // namespace

std::vector<StateDictEntry> read_safetensors(const std::string& path) {
  try {
    return read(path);
  } catch (const StateDictError&) {
    throw;
  } catch (const std::bad_alloc&) {  // the header's structures, the entries
    fail(path, "out of memory");
  } catch (const c10::Error& e) {  // from LibTorch on input we did not foresee: still the file's
    fail(path, e.what_without_backtrace());
  }
}

}  // namespace remat::models
