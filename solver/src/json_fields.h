#pragma once
// Reading remat's JSON files (chains, graphs): fields checked one by one, each error naming
// the file, the field's place and what was wrong, as ChainError:
// `FILE: stages[3].saved_bytes (1024) is smaller than ...`.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace remat::detail::json_fields {

using nlohmann::json;

/// A remat file's JSON text as a document, or ChainError naming `source`: text that is not
/// JSON (nlohmann's message, shortened and made printable), a NUL byte (where nlohmann would
/// stop reading, ignoring what follows), or a key twice in one object (which nlohmann would
/// keep the last of), named by its place ("stages[3].outputs[0].bytes").
json parse_document(const std::string& text, const std::string& source);
/// The whole text of the file at `path`, or ChainError: "<path>: is not a regular file" (a
/// directory, a FIFO: refused rather than read), "cannot open the <kind> file", "cannot read
/// the <kind> file". `kind`: "chain", "graph".
std::string read_file(const std::string& path, const char* kind);
/// Throws ChainError: "<source>: <where> <what>".
[[noreturn]] void fail(const std::string& source, const std::string& where,
                       const std::string& what);
/// "a number", "a string", ...: what a JSON value is, for messages.
std::string type_name(const json& value);
/// Checks one object's keys: every required key present, no key outside required and
/// optional. `what` names the object in the message (default: a chain at the top, else a
/// stage).
void check_keys(const json& object, const std::string& source, const std::string& where,
                const std::vector<std::string>& required, const std::vector<std::string>& optional,
                const char* what = nullptr);
std::string get_string(const json& value, const std::string& source, const std::string& where);
/// A time in milliseconds: a finite, non-negative number.
double get_ms(const json& value, const std::string& source, const std::string& where);
/// A size in bytes: a whole number from 0 to kMaxChainBytes.
std::int64_t get_bytes(const json& value, const std::string& source, const std::string& where);

}  // namespace remat::detail::json_fields
