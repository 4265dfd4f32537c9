#include "json_fields.h"

#include <cmath>
#include <set>

#include "remat/solver/chain.h"
#include "remat/solver/check.h"

namespace remat::detail::json_fields {

[[noreturn]] void fail(const std::string& source, const std::string& where,
                       const std::string& what) {
  throw ChainError(str_cat(source, ": ", where, where.empty() ? "" : " ", what));
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
