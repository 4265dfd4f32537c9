#include "remat/solver/sequence.h"

#include <cctype>
#include <charconv>

#include "remat/base/check.h"

namespace remat {
namespace {

const char* prefix(OpKind kind) {
  switch (kind) {
    case OpKind::kForwardGrad:
      return "Fe";
    case OpKind::kForwardNoGrad:
      return "Fn";
    case OpKind::kForwardCheckpoint:
      return "CF";
    case OpKind::kLoss:
      return "L";
    case OpKind::kBackward:
      return "B";
    case OpKind::kOffload:
      return "O";
    case OpKind::kEvict:
      return "E";
    case OpKind::kPrefetch:
      return "P";
  }
  return "?";
}

int parse_index(std::string_view digits, std::string_view token) {
  int value = -1;
  const auto* end = digits.data() + digits.size();
  const auto result = std::from_chars(digits.data(), end, value);
  REMAT_CHECK(!digits.empty() && result.ec == std::errc() && result.ptr == end && value >= 0,
              "bad operation '", token, "': expected a stage index after '_'");
  return value;
}

// Parses `Fn_3` or a run `Fn_3..7` / `B_7..3` into `out`.
void parse_token(std::string_view token, int length, Sequence& out) {
  if (token == "L") {
    out.push_back(loss(length));
    return;
  }
  const auto underscore = token.find('_');
  REMAT_CHECK(underscore != std::string_view::npos, "bad operation '", token,
              "': expected Fe_i, Fn_i, CF_i, L, B_i, O_i, E_i or P_i");
  const std::string_view name = token.substr(0, underscore);
  OpKind kind;
  if (name == "Fe") {
    kind = OpKind::kForwardGrad;
  } else if (name == "Fn") {
    kind = OpKind::kForwardNoGrad;
  } else if (name == "CF") {
    kind = OpKind::kForwardCheckpoint;
  } else if (name == "B") {
    kind = OpKind::kBackward;
  } else if (name == "O") {
    kind = OpKind::kOffload;
  } else if (name == "E") {
    kind = OpKind::kEvict;
  } else if (name == "P") {
    kind = OpKind::kPrefetch;
  } else {
    REMAT_CHECK(false, "bad operation '", token, "': unknown kind '", name,
                "' (expected Fe, Fn, CF, L, B, O, E or P)");
  }
  const std::string_view rest = token.substr(underscore + 1);
  const auto dots = rest.find("..");
  if (dots == std::string_view::npos) {
    out.push_back({kind, parse_index(rest, token)});
    return;
  }
  REMAT_CHECK(!is_copy(kind), "bad operation '", token,
              "': copies are written one at a time, not as a run");
  const int first = parse_index(rest.substr(0, dots), token);
  const int last = parse_index(rest.substr(dots + 2), token);
  const int step = kind == OpKind::kBackward ? -1 : 1;
  REMAT_CHECK((last - first) * step >= 0, "bad run '", token, "': ",
              kind == OpKind::kBackward ? "backwards run over decreasing stages"
                                        : "forwards run over increasing stages");
  for (int i = first;; i += step) {
    out.push_back({kind, i});
    if (i == last) break;
  }
}

}  // namespace

std::string Op::str() const {
  if (kind == OpKind::kLoss) return "L";
  return std::string(prefix(kind)) + "_" + std::to_string(stage);
}

Op parse_op(std::string_view text) {
  Sequence ops;
  parse_token(text, -1, ops);
  REMAT_CHECK(ops.size() == 1, "bad operation '", text, "': a run where one operation is expected");
  return ops.front();
}

std::vector<std::string> op_strings(const Sequence& sequence) {
  std::vector<std::string> out;
  out.reserve(sequence.size());
  for (const Op& op : sequence) out.push_back(op.str());
  return out;
}

std::string collapsed_string(const Sequence& sequence) {
  std::string out;
  std::size_t k = 0;
  while (k < sequence.size()) {
    const Op& first = sequence[k];
    std::size_t end = k + 1;
    if (first.kind != OpKind::kLoss && !is_copy(first.kind)) {
      const int step = first.kind == OpKind::kBackward ? -1 : 1;
      while (end < sequence.size() && sequence[end].kind == first.kind &&
             sequence[end].stage == sequence[end - 1].stage + step) {
        ++end;
      }
    }
    if (!out.empty()) out += ' ';
    out += first.str();
    if (end - k > 1) out += ".." + std::to_string(sequence[end - 1].stage);
    k = end;
  }
  return out;
}

Sequence parse_sequence(std::string_view text, int length) {
  Sequence out;
  std::size_t k = 0;
  while (k < text.size()) {
    while (k < text.size() && (std::isspace(static_cast<unsigned char>(text[k])) || text[k] == ','))
      ++k;
    std::size_t end = k;
    while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end])) &&
           text[end] != ',')
      ++end;
    if (end > k) parse_token(text.substr(k, end - k), length, out);
    k = end;
  }
  return out;
}

}  // namespace remat
