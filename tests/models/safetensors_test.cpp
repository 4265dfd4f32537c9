// read_safetensors on files written byte by byte here: a valid file with every dtype remat reads
// (and the bytes the reference implementation's own test expects it to write), then files that
// are valid but for one thing, each refused with a StateDictError that names the file and says
// what was wrong. Each hostile file is accepted, or refused with another message, by a reader
// that lacks the check it is named after.
#include "remat/models/safetensors.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "models/hostile_files.h"

namespace {

using remat::models::read_safetensors;
using remat::models::StateDictEntry;
using remat::models::StateDictError;
using remat::test::le_bytes;
using remat::test::read_under_memory_limit;
using remat::test::repeat;
using remat::test::TempFile;
using remat::test::under_memory_limit_child;

// A safetensors file: the header's length, the header, the data.
std::string safetensors(const std::string& header, const std::string& data) {
  return le_bytes(header.size(), 8) + header + data;
}

// One tensor's header entry, as the Python package writes it.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  uint64_t begin, uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
}

std::vector<std::string> names_of(const std::vector<StateDictEntry>& entries) {
  std::vector<std::string> names;
  for (const StateDictEntry& e : entries) names.push_back(e.name);
  return names;
}

std::vector<StateDictEntry> read_bytes(const std::string& bytes) {
  const TempFile file(bytes);
  return read_safetensors(file.path());
}

// The message of the StateDictError that reading `path` throws, checked to name the file once,
// at the start.
std::string error_at(const std::string& path) {
  try {
    read_safetensors(path);
  } catch (const StateDictError& e) {
    const std::string what = e.what();
    CHECK(what.rfind(path + ": ", 0) == 0);
    CHECK(what.find(path, 1) == std::string::npos);
    return what;
  }
  return "(no error)";
}

std::string error_of(const std::string& bytes) {
  const TempFile file(bytes);
  return error_at(file.path());
}

// Two float32 tensors: a = [1.5, -2], then b = [0.25].
const std::string kData = std::string("\x00\x00\xc0\x3f\x00\x00\x00\xc0\x00\x00\x80\x3e", 12);
const std::string kA = entry("a", "F32", "[2]", 0, 8);
const std::string kB = entry("b", "F32", "[1]", 8, 12);
const std::string kValid = safetensors("{" + kA + "," + kB + "}", kData);

}  // namespace

TEST_CASE("read_safetensors reads every dtype, a scalar, an empty tensor, in data order",
          "[models][safetensors]") {
  // The data, in file order; the header lists the tensors in another order, with metadata,
  // and is padded with spaces to a multiple of 8 bytes as the Python package pads it.
  std::string data;
  data += le_bytes(0x3ff8000000000000, 8) + le_bytes(0xc000000000000000, 8);  // f64 [0, 16)
  data += le_bytes(static_cast<uint64_t>(-3), 8);                             // i64 [16, 24)
  data += le_bytes(0x3fc00000, 4) + le_bytes(0xc0000000, 4) + le_bytes(0x3e800000, 4) +
          le_bytes(0x40400000, 4);                                    // f32 [24, 40)
  data += le_bytes(123456789, 4);                                     // i32 scalar [40, 44)
  data += le_bytes(0x3e00, 2) + le_bytes(0xc000, 2);                  // f16 [44, 48)
  data += le_bytes(0x3fc0, 2) + le_bytes(0xc000, 2);                  // bf16 [48, 52)
  data += le_bytes(static_cast<uint16_t>(-2), 2) + le_bytes(300, 2);  // i16 [52, 56)
  data += le_bytes(static_cast<uint8_t>(-5), 1) + le_bytes(7, 1);     // i8 [56, 58)
  data += le_bytes(200, 1);                                           // u8 [58, 59)
  data += le_bytes(1, 1) + le_bytes(0, 1) + le_bytes(1, 1);           // bool [59, 62)
  std::string header =
      "{" + entry("flags", "BOOL", "[3]", 59, 62) + "," + entry("f16", "F16", "[2]", 44, 48) + "," +
      entry("f64", "F64", "[2]", 0, 16) + "," +
      "\"__metadata__\":{\"format\":\"pt\",\"note\":\"a \\\"quoted\\\" \xc3\xbc\"}," +
      entry("u8", "U8", "[1]", 58, 59) + "," + entry("i8", "I8", "[2]", 56, 58) + "," +
      entry("bf16", "BF16", "[2]", 48, 52) + "," + entry("i16", "I16", "[2]", 52, 56) + "," +
      entry("empty", "F32", "[0,3]", 44, 44) + "," + entry("i32", "I32", "[]", 40, 44) + "," +
      entry("f32", "F32", "[2,2]", 24, 40) + "," + entry("i64", "I64", "[1]", 16, 24) + "}";
  header += std::string((8 - header.size() % 8) % 8 + 8, ' ');
  REQUIRE(header.size() % 8 == 0);

  const std::vector<StateDictEntry> entries = read_bytes(safetensors(header, data));
  CHECK(names_of(entries) == std::vector<std::string>{"f64", "i64", "f32", "i32", "empty", "f16",
                                                      "bf16", "i16", "i8", "u8", "flags"});
  REQUIRE(entries.size() == 11);
  const std::vector<torch::Tensor> expected = {
      torch::tensor({1.5, -2.0}, torch::kDouble),
      torch::tensor({int64_t{-3}}, torch::kLong),
      torch::tensor({1.5f, -2.0f, 0.25f, 3.0f}).reshape({2, 2}),
      torch::tensor(123456789, torch::kInt).reshape({}),
      torch::empty({0, 3}, torch::kFloat),
      torch::tensor({1.5f, -2.0f}).to(torch::kHalf),
      torch::tensor({1.5f, -2.0f}).to(torch::kBFloat16),
      torch::tensor({-2, 300}, torch::kShort),
      torch::tensor({-5, 7}, torch::kChar),
      torch::tensor({200}, torch::kByte),
      torch::tensor({true, false, true}, torch::kBool),
  };
  for (size_t i = 0; i < entries.size(); ++i) {
    INFO(entries[i].name);
    const torch::Tensor& tensor = entries[i].tensor;
    REQUIRE(tensor.defined());
    CHECK(tensor.device() == torch::kCPU);
    CHECK(tensor.is_contiguous());
    REQUIRE(tensor.scalar_type() == expected[i].scalar_type());
    CHECK(tensor.sizes() == expected[i].sizes());
    CHECK(torch::equal(tensor, expected[i]));
  }
  // Each tensor has its own memory (not a view of one buffer, not the file's).
  CHECK(entries[2].tensor.storage().nbytes() == 16);
  CHECK(entries[0].tensor.data_ptr() != entries[1].tensor.data_ptr());
}

TEST_CASE("read_safetensors reads the bytes the reference implementation writes",
          "[models][safetensors]") {
  // The Rust crate's own tests (safetensors/src/tensor.rs, test_serialization and test_empty)
  // expect its writer to produce exactly these bytes.
  const unsigned char attn[] = {
      64, 0,  0,   0,   0,   0,   0,   0,   123, 34,  97,  116, 116, 110, 46,  48,
      34, 58, 123, 34,  100, 116, 121, 112, 101, 34,  58,  34,  70,  51,  50,  34,
      44, 34, 115, 104, 97,  112, 101, 34,  58,  91,  49,  44,  50,  44,  51,  93,
      44, 34, 100, 97,  116, 97,  95,  111, 102, 102, 115, 101, 116, 115, 34,  58,
      91, 48, 44,  50,  52,  93,  125, 125, 0,   0,   0,   0,   0,   0,   128, 63,
      0,  0,  0,   64,  0,   0,   64,  64,  0,   0,   128, 64,  0,   0,   160, 64};
  const std::vector<StateDictEntry> entries =
      read_bytes(std::string(reinterpret_cast<const char*>(attn), sizeof attn));
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].name == "attn.0");
  CHECK(torch::equal(entries[0].tensor, torch::arange(6, torch::kFloat).reshape({1, 2, 3})));

  const unsigned char empty[] = {8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32};
  CHECK(read_bytes(std::string(reinterpret_cast<const char*>(empty), sizeof empty)).empty());
  const std::string metadata_only = "{\"__metadata__\":{\"framework\":\"pt\"}}     ";
  CHECK(read_bytes(safetensors(metadata_only, "")).empty());
}

TEST_CASE("read_safetensors accepts what the reference implementation accepts",
          "[models][safetensors]") {
  CHECK(names_of(read_bytes(kValid)) == std::vector<std::string>{"a", "b"});
  // Fields it does not know are ignored, however they nest (up to the depth limit); null
  // metadata is no metadata; whitespace around the object; brackets inside strings are text.
  const std::string nested = repeat("[", 60) + repeat("]", 60);
  const std::string extra = "{\"dtype\":\"F32\",\"shape\":[2],\"extra\":{\"x\":" + nested +
                            ",\"dtype\":1},\"data_offsets\":[0,8]}";
  CHECK(read_bytes(safetensors("{\"a\":" + extra + "," + kB + "}", kData)).size() == 2);
  CHECK(read_bytes(safetensors("{\"__metadata__\":null," + kA + "," + kB + "}", kData)).size() ==
        2);
  CHECK(read_bytes(safetensors(" \n{" + kA + "," + kB + "}\t ", kData)).size() == 2);
  const std::string brackets =
      "{\"__metadata__\":{\"k\":\"\\\"" + repeat("[{", 1000) + "\"}," + kA + "," + kB + "}";
  CHECK(read_bytes(safetensors(brackets, kData)).size() == 2);
  // Empty tensors may share an offset with each other and with the next tensor's start.
  const std::vector<StateDictEntry> empties =
      read_bytes(safetensors("{" + entry("z2", "I64", "[0]", 8, 8) + "," + kB + "," +
                                 entry("z1", "U8", "[4,0]", 8, 8) + "," + kA + "}",
                             kData));
  CHECK(names_of(empties) == std::vector<std::string>{"a", "z2", "z1", "b"});
}

TEST_CASE("read_safetensors names the file and the problem", "[models][safetensors]") {
  const std::string ab = kA + "," + kB;
  const uint64_t huge = uint64_t{1} << 62;
  struct Case {
    const char* what;
    std::string file;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"truncated length prefix", std::string("\x10\x00\x00", 3),
       "truncated: the file has 3 bytes, fewer than the 8 of the header length"},
      {"empty file", "", "truncated: the file has 0 bytes"},
      {"header length beyond the file", le_bytes(1000, 8) + "{}",
       "the header length at byte 0 (1000) goes beyond the end of the file (10 bytes)"},
      {"header length one byte beyond the file", le_bytes(3, 8) + "{}",
       "the header length at byte 0 (3) goes beyond the end of the file (10 bytes)"},
      {"a 50 GB header in 12 bytes", le_bytes(50'000'000'000, 8) + "{}  ",
       "the header length at byte 0 (50000000000) is over the format's limit of 100000000 bytes"},
      {"invalid JSON", safetensors("{\"a\":{\"dtype\":\"F32\",}}", ""),
       "the header is not valid JSON at byte 28: syntax error while parsing object key"},
      {"invalid UTF-8", safetensors("{\"\xff\":{}}", ""),
       "the header is not valid JSON at byte 10"},
      {"trailing text", safetensors("{}x", ""), "the header is not valid JSON at byte 10"},
      // nlohmann's lexer takes a NUL for the end of the input, and skips a byte-order mark.
      {"NUL padding", safetensors(std::string("{}\0\0", 4), ""),
       "the header is not valid JSON at byte 10: a NUL byte"},
      {"NUL then text", safetensors(std::string("{}\0x", 4), ""),
       "the header is not valid JSON at byte 10: a NUL byte"},
      {"byte-order mark", safetensors("\xef\xbb\xbf{}", ""),
       "the header is not valid JSON at byte 8: a byte-order mark"},
      {"empty header", safetensors("", ""), "the header is not valid JSON at byte 8"},
      {"an array", safetensors("[]", ""), "the header is an array, not a JSON object"},
      {"a string", safetensors("\"x\"", ""), "the header is a string, not a JSON object"},
      {"a number", safetensors("12", ""), "the header is the number 12, not a JSON object"},
      {"null", safetensors("null", ""), "the header is null, not a JSON object"},
      {"a million [", safetensors("{\"a\":" + repeat("[", 1'000'000), ""),
       "the header nests JSON more than 64 levels deep at byte 76"},
      {"65 levels in an ignored field",
       safetensors("{\"a\":{\"x\":" + repeat("[", 63) + repeat("]", 63) + "}}", ""),
       "the header nests JSON more than 64 levels deep at byte 80"},
      {"a duplicate name",
       safetensors("{" + kA + "," + entry("a", "F32", "[1]", 8, 12) + "}", kData),
       "tensor 'a' is named twice"},
      {"a duplicate field",
       safetensors(
           "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}," +
               kB + "}",
           kData),
       "tensor 'a' has two \"dtype\" fields"},
      {"two metadata", safetensors("{\"__metadata__\":{},\"__metadata__\":{}," + ab + "}", kData),
       "the header has two \"__metadata__\" entries"},
      {"a duplicate metadata key",
       safetensors("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}," + ab + "}", kData),
       "\"__metadata__\" names 'k' twice"},
      {"F8", safetensors("{" + entry("a", "F8_E4M3", "[8]", 0, 8) + "," + kB + "}", kData),
       "tensor 'a': dtype 'F8_E4M3' is not supported (remat reads BOOL, U8, I8, I16, I32, I64, "
       "F16, BF16, F32, F64)"},
      {"unknown dtype", safetensors("{" + entry("a", "F31", "[2]", 0, 8) + "," + kB + "}", kData),
       "tensor 'a': dtype 'F31' is not supported"},
      {"dtype not a string",
       safetensors("{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}," + kB + "}", kData),
       "tensor 'a': dtype is the number 4"},
      {"negative size", safetensors("{" + entry("a", "F32", "[-2]", 0, 8) + "," + kB + "}", kData),
       "tensor 'a': shape[0] is the number -2, not a size"},
      {"minus zero", safetensors("{" + entry("a", "F32", "[-0]", 0, 0) + "}", ""),
       "tensor 'a': shape[0] is the number -0, not a size"},
      {"float size", safetensors("{" + entry("a", "F32", "[2.0]", 0, 8) + "," + kB + "}", kData),
       "tensor 'a': shape[0] is the number 2.0, not a size"},
      {"size beyond uint64",
       safetensors("{" + entry("a", "F32", "[1,18446744073709551616]", 0, 8) + "," + kB + "}",
                   kData),
       "tensor 'a': shape[1] is the number 18446744073709551616, not a size"},
      {"string size", safetensors("{" + entry("a", "F32", "[\"2\"]", 0, 8) + "," + kB + "}", kData),
       "tensor 'a': shape[0] is a string, not a size"},
      // 2^62 * 4 * 4 bytes is 2^66: 0 modulo 2^64, the size that data_offsets [0, 0] hold.
      {"product overflow",
       safetensors("{" + entry("a", "F32", "[" + std::to_string(huge) + ",4]", 0, 0) + "}", ""),
       "tensor 'a': shape [4611686018427387904, 4] of F32 overflows 64 bits"},
      {"a size over int64",
       safetensors("{" + entry("a", "U8", "[9223372036854775808]", 0, 0) + "}", ""),
       "tensor 'a': shape [9223372036854775808] of U8 overflows 64 bits"},
      {"an empty tensor with huge sizes",
       safetensors("{" + entry("a", "F32", "[0," + std::to_string(huge) + ",4]", 0, 0) + "}", ""),
       "overflows 64 bits"},
      {"65 dimensions",
       safetensors("{" + entry("a", "F32", "[2" + repeat(",1", 64) + "]", 0, 8) + "," + kB + "}",
                   kData),
       "tensor 'a': the shape has more than 64 dimensions"},
      {"offsets reversed",
       safetensors("{" + kA + "," + entry("b", "F32", "[1]", 12, 8) + "}", kData),
       "tensor 'b': data_offsets [12, 8] end before they begin"},
      {"offsets beyond the data",
       safetensors("{" + kA + "," + entry("b", "F32", "[100]", 8, 408) + "}", kData),
       "tensor 'b': data_offsets [8, 408] go beyond the end of the file, whose data holds 12 "
       "bytes"},
      {"50 GB in a small file",
       safetensors("{" + entry("a", "U8", "[50000000000]", 0, 50'000'000'000) + "}", kData),
       "tensor 'a': data_offsets [0, 50000000000] go beyond the end of the file"},
      {"size mismatch", safetensors("{" + entry("a", "F32", "[3]", 0, 8) + "," + kB + "}", kData),
       "tensor 'a': shape [3] of F32 is 12 bytes, data_offsets [0, 8] hold 8"},
      {"hole", safetensors("{" + entry("a", "F32", "[1]", 0, 4) + "," + kB + "}", kData),
       "bytes 4 to 8 of the data (file bytes 120 to 124) belong to no tensor: a hole between "
       "tensor 'a' and tensor 'b'"},
      {"hole at the start", safetensors("{" + entry("b", "F32", "[2]", 4, 12) + "}", kData),
       "bytes 0 to 4 of the data (file bytes 63 to 67) belong to no tensor: a hole before tensor "
       "'b'"},
      {"overlap", safetensors("{" + kA + "," + entry("b", "F32", "[2]", 4, 12) + "}", kData),
       "tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a' (data_offsets [0, 8])"},
      {"an empty tensor inside another",
       safetensors("{" + ab + "," + entry("z", "F32", "[0]", 4, 4) + "}", kData),
       "tensor 'z' (data_offsets [4, 4]) overlaps tensor 'a'"},
      {"trailing bytes", safetensors("{" + kA + "}", kData),
       "4 bytes after the last tensor (file bytes 70 to 74) belong to no tensor"},
      {"data and no tensors", safetensors("{}", "abcd"),
       "4 bytes after the last tensor (file bytes 10 to 14) belong to no tensor"},
      {"metadata value not a string", safetensors("{\"__metadata__\":{\"k\":1}," + ab + "}", kData),
       "\"__metadata__\" entry 'k' is the number 1, not a string"},
      {"metadata value an object", safetensors("{\"__metadata__\":{\"k\":{}}," + ab + "}", kData),
       "\"__metadata__\" entry 'k' is an object, not a string"},
      {"metadata an array", safetensors("{\"__metadata__\":[]," + ab + "}", kData),
       "\"__metadata__\" is an array, not an object of strings"},
      {"metadata a string", safetensors("{\"__metadata__\":\"pt\"," + ab + "}", kData),
       "\"__metadata__\" is a string, not an object of strings"},
      {"tensor not an object", safetensors("{" + kA + ",\"b\":[8,12]}", kData),
       "tensor 'b' is an array, not an object with dtype, shape and data_offsets"},
      {"no dtype", safetensors("{" + kA + ",\"b\":{\"shape\":[1],\"data_offsets\":[8,12]}}", kData),
       "tensor 'b' has no dtype"},
      {"no shape",
       safetensors("{" + kA + ",\"b\":{\"dtype\":\"F32\",\"data_offsets\":[8,12]}}", kData),
       "tensor 'b' has no shape"},
      {"no offsets", safetensors("{" + kA + ",\"b\":{\"dtype\":\"F32\",\"shape\":[1]}}", kData),
       "tensor 'b' has no data_offsets"},
      {"three offsets",
       safetensors(
           "{" + kA + ",\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12,12]}}",
           kData),
       "tensor 'b': data_offsets has more than 2 values"},
      {"one offset",
       safetensors("{" + kA + ",\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8]}}",
                   kData),
       "tensor 'b': data_offsets [8] is not [begin, end]"},
      {"negative offset",
       safetensors("{" + kA + ",\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,-1]}}",
                   kData),
       "tensor 'b': data_offsets[1] is the number -1, not a byte offset"},
      {"shape not an array",
       safetensors("{" + kA + ",\"b\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[8,12]}}",
                   kData),
       "tensor 'b': shape is the number 1, not an array"},
      {"a BOOL that is 2",
       safetensors("{" + entry("a", "BOOL", "[2]", 0, 2) + "}", std::string("\x01\x02", 2)),
       "tensor 'a' (BOOL) holds 2 at byte "},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    CHECK_THAT(error_of(c.file), Catch::Contains(c.message));
  }
}

TEST_CASE("read_safetensors names long names shortly", "[models][safetensors]") {
  const std::string name = repeat("n", 100'000);
  const std::string message =
      error_of(safetensors("{" + entry(name, "F31", "[2]", 0, 8) + "," + kB + "}", kData));
  CHECK_THAT(message, Catch::Contains("tensor '" + repeat("n", 200) + "...' (100000 bytes)"));
  CHECK(message.size() < 1000);
}

TEST_CASE("read_safetensors escapes the names it quotes", "[models][safetensors]") {
  // A tensor named with a terminal's escape sequence (ESC ] 0 ; ... BEL retitles the window),
  // a NUL and more after it, as JSON escapes: each byte reaches the message written out.
  const std::string message = error_of(safetensors(
      "{" + entry("\\u001b]0;x\\u0007\\u0000y", "F31", "[2]", 0, 8) + "," + kB + "}", kData));
  CHECK_THAT(message,
             Catch::Contains("tensor '\\x1b]0;x\\x07\\x00y': dtype 'F31' is not supported"));
  const auto control = std::find_if(message.begin(), message.end(), [](char c) {
    return c != '\n' && (static_cast<unsigned char>(c) < 0x20 || c == 0x7f);
  });
  CHECK(control == message.end());
}

TEST_CASE("read_safetensors checks the header length against the 100 MB limit",
          "[models][safetensors]") {
  // A sparse file of 100 MB and a few bytes whose header length is one past the limit, so that
  // the header would fit in the file: only the limit refuses it. 100,000,000 is allowed (it
  // then fails as JSON: the bytes are zeros).
  const uint64_t size = 100'000'000 + 64;
  const TempFile over(le_bytes(100'000'001, 8), size);
  CHECK_THAT(error_at(over.path()),
             Catch::Contains("the header length at byte 0 (100000001) is over the format's limit"));
  const TempFile at(le_bytes(100'000'000, 8) + "{", size);
  CHECK_THAT(error_at(at.path()), Catch::Contains("the header is not valid JSON at byte 9"));
}

TEST_CASE("read_safetensors refuses what is not a regular file", "[models][safetensors]") {
  char folder[] = "/tmp/remat-safetensors-folder-XXXXXX";
  REQUIRE(mkdtemp(folder) != nullptr);
  CHECK_THAT(error_at(folder), Catch::Contains("not a regular file"));
  // A FIFO without a writer: refused at once, where opening it to read would wait.
  const std::string fifo = std::string(folder) + "/fifo.safetensors";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THAT(error_at(fifo), Catch::Contains("not a regular file"));
  std::remove(fifo.c_str());
  CHECK_THAT(error_at(std::string(folder) + "/missing.safetensors"),
             Catch::Contains("cannot open: No such file or directory"));
  rmdir(folder);
}

TEST_CASE("an allocation that fails is a StateDictError naming the tensor",
          "[models][safetensors]") {
  // Address space for 64 MiB more than the reading process maps: a 256 MiB tensor (a sparse
  // file) cannot be allocated, and neither can a header of 99 MB. Read in a fresh process
  // (read_under_memory_limit: this one's heap may hold that much free memory already).
  const uint64_t big = uint64_t{256} << 20;
  const std::string big_header =
      "{" + entry("big", "U8", "[" + std::to_string(big) + "]", 0, big) + "}";
  const TempFile tensor(safetensors(big_header, ""), 8 + big_header.size() + big);
  const TempFile header(le_bytes(99'000'000, 8), 8 + 99'000'000);
  const std::vector<std::string> errors =
      read_under_memory_limit("safetensors under a memory limit", {tensor.path(), header.path()});
  REQUIRE(errors.size() == 2);
  CHECK_THAT(errors[0], Catch::StartsWith(tensor.path() + ": ") &&
                            Catch::Contains("cannot allocate tensor 'big' (268435456 bytes)"));
  CHECK_THAT(errors[1], Catch::StartsWith(header.path() + ": ") &&
                            Catch::Contains("out of memory for the header (99000000 bytes)"));
}

TEST_CASE("safetensors under a memory limit", "[.][child]") {
  under_memory_limit_child<StateDictError>([](const std::string& path) { read_safetensors(path); });
}
