#include "remat/solver/chain.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "remat/solver/check.h"
#include "remat/solver/files.h"

namespace remat {
namespace {

using detail::str_cat;
using nlohmann::json;

// Error messages read `FILE: stages[3].saved_bytes (1024) is smaller than ...`.
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
                const std::vector<std::string>& required,
                const std::vector<std::string>& optional) {
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
           str_cat("is not a field of ", where.empty() ? "a chain" : "a stage",
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

std::string stage_where(std::size_t index) { return str_cat("stages[", index, "]"); }

}  // namespace

std::int64_t Chain::activation_bytes(int k) const {
  REMAT_CHECK(k >= 0 && k <= length(), "activation index ", k, " is outside 0..", length());
  return k == 0 ? input_bytes : stages[static_cast<std::size_t>(k - 1)].out_bytes;
}

double Chain::store_all_ms() const {
  double total = 0;
  for (const auto& stage : stages) total += stage.fwd_ms;
  for (const auto& stage : stages) total += stage.bwd_ms;
  return total;
}

void Chain::validate(const std::string& source) const {
  if (stages.empty()) fail(source, "stages", "is empty: a chain needs at least one stage");
  auto check_bytes = [&](std::int64_t bytes, const std::string& where) {
    if (bytes < 0) fail(source, where, str_cat("(", bytes, ") must not be negative"));
    if (bytes > kMaxChainBytes)
      fail(source, where, str_cat("(", bytes, ") exceeds the largest size, 2^50 bytes"));
  };
  auto check_ms = [&](double ms, const std::string& where) {
    if (!std::isfinite(ms)) fail(source, where, "must be finite");
    if (ms < 0) fail(source, where, str_cat("(", ms, ") must not be negative"));
  };
  check_bytes(input_bytes, "input_bytes");
  check_bytes(loss_tmp_bytes, "loss_tmp_bytes");
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const Stage& stage = stages[i];
    const std::string where = stage_where(i);
    check_ms(stage.fwd_ms, where + ".fwd_ms");
    check_ms(stage.bwd_ms, where + ".bwd_ms");
    if (stage.fwd_nograd_ms) check_ms(*stage.fwd_nograd_ms, where + ".fwd_nograd_ms");
    check_bytes(stage.out_bytes, where + ".out_bytes");
    check_bytes(stage.saved_bytes, where + ".saved_bytes");
    check_bytes(stage.fwd_tmp_bytes, where + ".fwd_tmp_bytes");
    check_bytes(stage.bwd_tmp_bytes, where + ".bwd_tmp_bytes");
    if (stage.saved_bytes < stage.out_bytes)
      fail(source, where + ".saved_bytes",
           str_cat("(", stage.saved_bytes, ") is smaller than out_bytes (", stage.out_bytes,
                   "): saved_bytes counts the output too"));
  }
}

Chain parse_chain(const std::string& json_text, const std::string& source) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::exception& error) {
    // nlohmann's message reads "[json.exception.parse_error.101] parse error at line 3, ...".
    std::string message = error.what();
    const auto bracket = message.find("] ");
    if (bracket != std::string::npos) message = message.substr(bracket + 2);
    fail(source, "", str_cat("is not valid JSON: ", message));
  }
  if (!doc.is_object())
    fail(source, "", str_cat("is not a remat chain: expected a JSON object, got ", type_name(doc)));
  if (!doc.contains("format"))
    fail(source, "",
         str_cat("is not a remat chain: no \"format\" field (expected \"", kChainFormat, "\")"));
  const std::string format = get_string(doc.at("format"), source, "format");
  if (format != kChainFormat)
    fail(source, "format",
         str_cat("is \"", format, "\"; this version of remat reads \"", kChainFormat, "\""));
  check_keys(doc, source, "", {"format", "name", "input_bytes", "stages"}, {"loss_tmp_bytes"});

  Chain chain;
  chain.name = get_string(doc.at("name"), source, "name");
  chain.input_bytes = get_bytes(doc.at("input_bytes"), source, "input_bytes");
  if (doc.contains("loss_tmp_bytes"))
    chain.loss_tmp_bytes = get_bytes(doc.at("loss_tmp_bytes"), source, "loss_tmp_bytes");
  const json& stages = doc.at("stages");
  if (!stages.is_array())
    fail(source, "stages", str_cat("must be an array of stages, got ", type_name(stages)));
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const json& item = stages[i];
    const std::string where = stage_where(i);
    if (!item.is_object()) fail(source, where, str_cat("must be an object, got ", type_name(item)));
    check_keys(
        item, source, where,
        {"name", "fwd_ms", "bwd_ms", "out_bytes", "saved_bytes", "fwd_tmp_bytes", "bwd_tmp_bytes"},
        {"fwd_nograd_ms"});
    Stage stage;
    stage.name = get_string(item.at("name"), source, where + ".name");
    stage.fwd_ms = get_ms(item.at("fwd_ms"), source, where + ".fwd_ms");
    stage.bwd_ms = get_ms(item.at("bwd_ms"), source, where + ".bwd_ms");
    stage.out_bytes = get_bytes(item.at("out_bytes"), source, where + ".out_bytes");
    stage.saved_bytes = get_bytes(item.at("saved_bytes"), source, where + ".saved_bytes");
    stage.fwd_tmp_bytes = get_bytes(item.at("fwd_tmp_bytes"), source, where + ".fwd_tmp_bytes");
    stage.bwd_tmp_bytes = get_bytes(item.at("bwd_tmp_bytes"), source, where + ".bwd_tmp_bytes");
    if (item.contains("fwd_nograd_ms"))
      stage.fwd_nograd_ms = get_ms(item.at("fwd_nograd_ms"), source, where + ".fwd_nograd_ms");
    chain.stages.push_back(std::move(stage));
  }
  chain.validate(source);
  return chain;
}

Chain load_chain(const std::string& path) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
    throw ChainError(str_cat(path, ": is not a regular file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ChainError(str_cat(path, ": cannot open the chain file"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ChainError(str_cat(path, ": cannot read the chain file"));
  return parse_chain(text.str(), path);
}

std::string chain_to_json(const Chain& chain) {
  json doc = json::object();
  doc["format"] = kChainFormat;
  doc["name"] = chain.name;
  doc["input_bytes"] = chain.input_bytes;
  json stages = json::array();
  for (const Stage& stage : chain.stages) {
    json item = json::object();
    item["name"] = stage.name;
    item["fwd_ms"] = stage.fwd_ms;
    item["bwd_ms"] = stage.bwd_ms;
    item["out_bytes"] = stage.out_bytes;
    item["saved_bytes"] = stage.saved_bytes;
    item["fwd_tmp_bytes"] = stage.fwd_tmp_bytes;
    item["bwd_tmp_bytes"] = stage.bwd_tmp_bytes;
    if (stage.fwd_nograd_ms) item["fwd_nograd_ms"] = *stage.fwd_nograd_ms;
    stages.push_back(std::move(item));
  }
  doc["stages"] = std::move(stages);
  doc["loss_tmp_bytes"] = chain.loss_tmp_bytes;
  return doc.dump(2) + "\n";
}

void save_chain(const Chain& chain, const std::string& path) {
  write_text_file(path, chain_to_json(chain), "the chain file");
}

}  // namespace remat
