#include "json_fields.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include "remat/base/check.h"
#include "remat/base/text.h"
#include "remat/solver/chain.h"

namespace remat::detail::json_fields {

[[noreturn]] void fail(const std::string& source, const std::string& where,
                       const std::string& what) {
  // The place and the message can quote the file (a key, a name, a value): shortened, so that
  // a key of 100,000 characters is not 100 KB of stderr.
  throw ChainError(
      str_cat(source, ": ", shortened(where, 300), where.empty() ? "" : " ", shortened(what, 600)));
}

namespace {
// An open object or array while a document is read, for the place of a duplicate key.
struct OpenValue {
  bool array = false;
  std::int64_t index = -1;  // an array's element being read
  std::string key;          // an object's member being read
  std::set<std::string> keys;
};

std::string place(const std::vector<OpenValue>& open, const std::string& key) {
  std::string out;
  for (const OpenValue& value : open) {
    if (&value == &open.back()) break;
    out += value.array ? str_cat("[", value.index, "]") : (out.empty() ? "" : ".") + value.key;
  }
  return out + (out.empty() ? "" : ".") + key;
}
}  // namespace

json parse_document(const std::string& text, const std::string& source) {
  if (const auto nul = text.find('\0'); nul != std::string::npos)
    fail(source, "", str_cat("is not valid JSON: a NUL byte at offset ", nul));
  std::vector<OpenValue> open;
  std::string duplicate;
  const json::parser_callback_t check = [&](int, json::parse_event_t event, json& parsed) {
    using Event = json::parse_event_t;
    const auto element = [&] {
      if (!open.empty() && open.back().array) ++open.back().index;
    };
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        element();
        open.emplace_back();
        open.back().array = event == Event::array_start;
        break;
      case Event::object_end:
      case Event::array_end:
        if (!open.empty()) open.pop_back();
        break;
      case Event::key:
        if (!open.empty()) {
          open.back().key = parsed.get<std::string>();
          if (!open.back().keys.insert(open.back().key).second && duplicate.empty())
            duplicate = place(open, open.back().key);
        }
        break;
      case Event::value:
        element();
        break;
    }
    return true;
  };
  json doc;
  try {
    doc = json::parse(text, check);
  } catch (const json::exception& error) {
    // nlohmann's message reads "[json.exception.parse_error.101] parse error at line 3, ...".
    std::string message = error.what();
    const auto bracket = message.find("] ");
    if (bracket != std::string::npos) message = message.substr(bracket + 2);
    fail(source, "", str_cat("is not valid JSON: ", shortened(message, 200)));
  }
  if (!duplicate.empty())
    fail(source, shortened(duplicate, 100), "is given twice (a key once per object)");
  return doc;
}

std::string read_file(const std::string& path, const char* kind) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
    throw ChainError(str_cat(path, ": is not a regular file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ChainError(str_cat(path, ": cannot open the ", kind, " file"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ChainError(str_cat(path, ": cannot read the ", kind, " file"));
  return text.str();
}

std::string type_name(const json& value) {
  if (value.is_number()) return "a number";
  if (value.is_string()) return "a string";
  if (value.is_boolean()) return "a boolean";
  if (value.is_null()) return "null";
  if (value.is_array()) return "an array";
  return "an object";
}

// Reads one object's keys: every required key present, no key outside `allowed`.
void check_keys(const json& object, const std::string& source, const std::string& where,
                const std::vector<std::string>& required, const std::vector<std::string>& optional,
                const char* what) {
  std::set<std::string> allowed(required.begin(), required.end());
  allowed.insert(optional.begin(), optional.end());
  for (const auto& key : required) {
    if (!object.contains(key)) fail(source, where.empty() ? key : where + "." + key, "is missing");
  }
  for (const auto& item : object.items()) {
    if (!allowed.count(item.key())) {
      std::string list;
      for (const auto& key : allowed) list += (list.empty() ? "" : ", ") + key;
      fail(source, where.empty() ? item.key() : where + "." + item.key(),
           str_cat("is not a field of ",
                   what            ? what
                   : where.empty() ? "a chain"
                                   : "a stage",
                   " (expected: ", list, ")"));
    }
  }
}

std::string get_string(const json& value, const std::string& source, const std::string& where) {
  if (!value.is_string()) fail(source, where, str_cat("must be a string, got ", type_name(value)));
  return value.get<std::string>();
}

double get_ms(const json& value, const std::string& source, const std::string& where) {
  if (!value.is_number())
    fail(source, where, str_cat("must be a number of milliseconds, got ", type_name(value)));
  const double ms = value.get<double>();
  if (!std::isfinite(ms)) fail(source, where, "must be finite");
  if (ms < 0) fail(source, where, str_cat("(", value.dump(), ") must not be negative"));
  return ms;
}

std::int64_t get_bytes(const json& value, const std::string& source, const std::string& where) {
  if (!value.is_number())
    fail(source, where, str_cat("must be a number of bytes, got ", type_name(value)));
  if (value.is_number_unsigned()) {
    const auto bytes = value.get<std::uint64_t>();
    if (bytes > static_cast<std::uint64_t>(kMaxChainBytes))
      fail(source, where, str_cat("(", bytes, ") exceeds the largest size, 2^50 bytes"));
    return static_cast<std::int64_t>(bytes);
  }
  if (value.is_number_integer()) {
    const auto bytes = value.get<std::int64_t>();
    if (bytes < 0) fail(source, where, str_cat("(", bytes, ") must not be negative"));
    if (bytes > kMaxChainBytes)
      fail(source, where, str_cat("(", bytes, ") exceeds the largest size, 2^50 bytes"));
    return bytes;
  }
  const double bytes = value.get<double>();
  if (!std::isfinite(bytes)) fail(source, where, "must be finite");
  if (bytes < 0) fail(source, where, str_cat("(", value.dump(), ") must not be negative"));
  if (bytes != std::floor(bytes))
    fail(source, where, str_cat("(", value.dump(), ") must be a whole number of bytes"));
  if (bytes > static_cast<double>(kMaxChainBytes))
    fail(source, where, str_cat("(", value.dump(), ") exceeds the largest size, 2^50 bytes"));
  return static_cast<std::int64_t>(bytes);
}

}  // namespace remat::detail::json_fields
