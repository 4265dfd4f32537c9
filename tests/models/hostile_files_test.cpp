// read_state_dict on files made to hurt it (tests/models/hostile_files.h writes them byte by
// byte): nesting of any depth, keys that double in size, zip archives that lie about their sizes,
// pickles that build millions of values from a few bytes, an allocation that fails. Each is a
// StateDictError naming the file and the offset, and memory stays proportional to the file.
#include "models/hostile_files.h"

#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "remat/models/state_dict.h"

namespace {

using remat::models::read_state_dict;
using remat::models::StateDictEntry;
using remat::models::StateDictError;
using namespace remat::test;

std::string error_of(const std::string& bytes) {
  const TempFile file(bytes);
  try {
    read_state_dict(file.path());
  } catch (const StateDictError& e) {
    const std::string what = e.what();
    // Names the file once, at the start.
    CHECK(what.rfind(file.path() + ": ", 0) == 0);
    CHECK(what.find(file.path(), 1) == std::string::npos);
    return what;
  }
  return "(no error)";
}

// The main pickle as a legacy file and as the data.pkl of a zip archive.
std::vector<std::pair<std::string, std::string>> both_formats(const std::string& pickle) {
  return {{"legacy", legacy_file(pickle)}, {"zip", zip_file({{"data.pkl", pickle}})}};
}

long max_rss_kib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

const std::string kKey = binunicode("x");

}  // namespace

TEST_CASE("the hand-made files are valid: a zip, a zip64 and a deflated pickle", "[models]") {
  // So that the refusals below are the reader's checks, not a broken writer.
  Deflate deflate;
  deflate.literal(two_floats_pickle());
  for (const std::string& file :
       {zip_file({{"data.pkl", two_floats_pickle()}, {"data/0", kTwoFloats}}),
        zip_file({{"data.pkl", two_floats_pickle()}, {"data/0", kTwoFloats}}, /*zip64=*/true),
        zip_file({deflated("data.pkl", deflate), {"data/0", kTwoFloats}})}) {
    const TempFile temp(file);
    const std::vector<StateDictEntry> entries = read_state_dict(temp.path());
    REQUIRE(entries.size() == 1);
    CHECK(entries[0].name == "w");
    CHECK(torch::equal(entries[0].tensor, torch::tensor({1.5f, -2.0f})));
  }
}

TEST_CASE("read_state_dict survives nesting of any depth", "[models]") {
  const size_t depth = 100000;
  const std::string deep_tuple = ")" + repeat("\x85", depth);  // ((((),),),)...
  const std::string deep_list = repeat("]", depth) + repeat("a", depth - 1);
  const std::vector<std::pair<std::string, std::string>> cases = {
      // A tuple nested 100,000 deep as a dict key: hashing it recursed once per level.
      {"\x80\x02}" + deep_tuple + "Ns.", "dict key (tuple) longer than 4096 bytes at byte "},
      // As values: freeing them recursed once per level.
      {"\x80\x02}" + kKey + deep_tuple + "s.", "'x' holds a tuple"},
      {"\x80\x02}" + kKey + deep_list + "s.", "'x' holds a list"},
      // A failure with the deep tuple still on the stack.
      {"\x80\x02}" + deep_tuple + "\xff", "unsupported pickle opcode 0xff at byte "},
  };
  for (const auto& [pickle, message] : cases) {
    for (const auto& [format, file] : both_formats(pickle)) {
      INFO(format << ": " << message);
      CHECK_THAT(error_of(file), Catch::Contains(message));
    }
  }
}

TEST_CASE("read_state_dict refuses a key that doubles with every two bytes", "[models]") {
  // t = (t, t) sixty-four times: 2^64 leaves. Python itself would hash it forever.
  const std::string pickle = std::string("\x80\x02}") + ")" + repeat("2\x86", 64) + "Ns.";
  for (const auto& [format, file] : both_formats(pickle)) {
    INFO(format);
    CHECK_THAT(error_of(file), Catch::Contains("dict key (tuple) longer than 4096 bytes at byte"));
  }
}

TEST_CASE("read_state_dict checks the sizes a zip archive declares before it allocates",
          "[models]") {
  const std::string pickle = two_floats_pickle();
  // A stored record that declares 2 GiB: LibTorch would allocate them, then fail to read.
  ZipRecord stored{"data.pkl", pickle};
  stored.size = uint64_t{1} << 31;
  CHECK_THAT(error_of(zip_file({stored, {"data/0", kTwoFloats}})),
             Catch::Contains("record archive/data.pkl declares 2147483648 bytes from " +
                             std::to_string(pickle.size()) + " in the file at byte "));
  // A deflated one that claims more than deflate can expand to.
  Deflate deflate;
  deflate.literal(pickle);
  ZipRecord bomb = deflated("data.pkl", deflate);
  bomb.size = uint64_t{1} << 31;
  CHECK_THAT(error_of(zip_file({bomb, {"data/0", kTwoFloats}})),
             Catch::Contains("record archive/data.pkl declares 2147483648 bytes from"));
  // Two records on the same bytes (each record of an overlapping "zip bomb" reuses the others').
  ZipRecord first{"data/0", kTwoFloats};
  ZipRecord second{"data/1", kTwoFloats};
  second.header_offset = 30 + 15 + 2;  // where data/0 is, after archive/version
  CHECK_THAT(error_of(zip_file({first, second, {"data.pkl", pickle}})),
             Catch::Contains("two records share bytes at byte 47"));
  // A compression method LibTorch cannot read.
  ZipRecord bzip2{"data.pkl", pickle};
  bzip2.method = 12;
  CHECK_THAT(error_of(zip_file({bzip2})),
             Catch::Contains("record archive/data.pkl is compressed with method 12"));
}

TEST_CASE("read_state_dict caps the values, the stack and the memo a pickle builds", "[models]") {
  SECTION("two million values from a deflated pickle of 12 KB") {
    Deflate deflate;
    deflate.literal("\x80\x02(N2").copies(1, 258 * 8000).literal(".");
    const std::string file = zip_file({deflated("data.pkl", deflate)});
    CHECK(file.size() < 16000);
    CHECK_THAT(error_of(file), Catch::Contains("the pickle builds more than ") &&
                                   Catch::Contains(" values, more than a file of its size can "
                                                   "honestly need at byte "));
  }
  SECTION("a stack of a million values") {
    // The legacy header pickles take 25 bytes, then PROTO and NONE: DUP number 2^20 is at 1048603.
    CHECK_THAT(error_of(legacy_file("\x80\x02N" + repeat("2", 1 << 20) + ".")),
               Catch::Contains("pickle stack deeper than 1048576 values at byte 1048603"));
  }
  SECTION("a million MARKs") {
    CHECK_THAT(error_of(legacy_file("\x80\x02" + repeat("(", (1 << 20) + 1) + ".")),
               Catch::Contains("more than 1048576 MARKs open at byte 1048603"));
  }
  SECTION("a million memo entries") {
    CHECK_THAT(error_of(legacy_file("\x80\x02N" + repeat("\x94", (1 << 20) + 1) + ".")),
               Catch::Contains("pickle memo larger than 1048576 entries at byte"));
  }
  SECTION("legacy storages that together need more than the file holds") {
    const auto storage = [](const std::string& key) {
      return "(" + binunicode("storage") + "ctorch\nByteStorage\n" + binunicode(key) +
             binunicode("cpu") + "M" + le_bytes(600, 2) + "NtQ";
    };
    // Each of the two fits in the 1,000 bytes after it; both do not.
    const std::string pickle = "\x80\x02}" + storage("0") + "0" + storage("1") + "0.";
    CHECK_THAT(error_of(legacy_file(pickle) + std::string(1000, '\0')),
               Catch::Contains("storage '1' needs more bytes than the file holds"));
  }
}

TEST_CASE("a copied string is not copied: a 1 KB file cannot take gigabytes", "[models]") {
  // A 64 KiB string, then 30,000 DUPs of it: 2 GB when each copy copied the text.
  Deflate deflate;
  deflate.literal("\x80\x02X" + le_bytes(258 * 254 + 1, 4) + "a")
      .copies(1, 258 * 254)
      .literal("2")
      .copies(1, 258 * 116)
      .literal(".");
  const std::string file = zip_file({deflated("data.pkl", deflate)});
  CHECK(file.size() < 1000);
  const long before = max_rss_kib();
  CHECK_THAT(error_of(file), Catch::Contains("the file holds a str, not a state dict"));
  const long grown_mib = (max_rss_kib() - before) / 1024;
  INFO("the peak resident memory grew by " << grown_mib << " MiB");
  CHECK(grown_mib < 64);
}

TEST_CASE("an allocation that fails is a StateDictError with the offset", "[models]") {
  // Address space for 64 MiB more than the reading process maps: the stack of a million values
  // (about 110 MiB) cannot be allocated. Read in a fresh process (read_under_memory_limit: this
  // one's heap may hold that much free memory already).
  const std::string file = legacy_file("\x80\x02N" + repeat("2", (1 << 20) - 1) + ".");
  const TempFile temp(file);
  const std::vector<std::string> errors =
      read_under_memory_limit("state dicts under a memory limit", {temp.path()});
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0],
             Catch::StartsWith(temp.path() + ": ") && Catch::Contains("out of memory at byte "));
}

TEST_CASE("state dicts under a memory limit", "[.][child]") {
  under_memory_limit_child<StateDictError>([](const std::string& path) { read_state_dict(path); });
}

TEST_CASE("read_state_dict's words fit the file: offsets past 64 bits, byte orders, raw names",
          "[models]") {
  // A storage offset of 2^64 (LONG1 of 9 bytes) where an int is due: not "an int, not an int".
  std::string pickle = two_floats_pickle();
  const std::string zero_offset("K\0", 2);
  pickle.replace(pickle.find(zero_offset), zero_offset.size(),
                 "\x8a\x09" + le_bytes(0, 8) + std::string(1, '\x01'));
  CHECK_THAT(error_of(zip_file({{"data.pkl", pickle}, {"data/0", kTwoFloats}})),
             Catch::Contains("storage offset does not fit in 64 bits at byte "));
  // A byte-order record that is neither: not "written on a big-endian machine".
  const std::string odd = error_of(zip_file(
      {{"byteorder", "\x1b[2Jmiddle"}, {"data.pkl", two_floats_pickle()}, {"data/0", kTwoFloats}}));
  CHECK_THAT(odd, Catch::Contains("its byteorder record is neither \"little\" nor \"big\" but "
                                  "\"\\x1b[2Jmiddle\""));
  CHECK_THAT(error_of(zip_file({{"byteorder", "big"}, {"data.pkl", two_floats_pickle()}})),
             Catch::Contains("written on a big-endian machine"));
  // A key with a terminal's escape sequence and a NUL, quoted in the error: escaped, whole.
  const std::string key("\x1b]0;owned\x07\0tail", 15);
  for (const auto& [format, file] : both_formats("\x80\x02}" + binunicode(key) + "K\x01s.")) {
    INFO(format);
    const std::string error = error_of(file);
    CHECK_THAT(error, Catch::Contains("\\x1b]0;owned\\x07\\x00tail"));
    CHECK(error.find('\x1b') == std::string::npos);
  }
}
