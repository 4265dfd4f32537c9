#include "remat/base/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <limits>
#include <string>

#include "remat/base/check.h"

namespace remat {

namespace {

__extension__ typedef __int128 Wide;  // GCC and Clang
constexpr Wide kMaxResult = static_cast<Wide>(std::numeric_limits<std::int64_t>::max());

// A decimal number as digits * 10^exponent, read exactly (no floating point): sizes like
// 1.001GB must come out as 1001000000 bytes, not one byte less.
struct Decimal {
  Wide digits = 0;
  int exponent = 0;
};

bool parse_decimal(std::string_view text, Decimal& out) {
  std::size_t k = 0;
  bool any_digit = false, seen_point = false;
  int significant = 0;
  for (; k < text.size(); ++k) {
    const char c = text[k];
    if (c == '.' && !seen_point) {
      seen_point = true;
    } else if (c >= '0' && c <= '9') {
      any_digit = true;
      if (out.digits == 0 && c == '0') {
        if (seen_point) --out.exponent;  // leading zeros after the point
        continue;
      }
      if (significant < 19) {
        out.digits = out.digits * 10 + (c - '0');
        ++significant;
        if (seen_point) --out.exponent;
      } else if (!seen_point) {
        ++out.exponent;  // digits beyond 19 are dropped (floored)
      }
    } else {
      break;
    }
  }
  if (!any_digit) return false;
  if (k < text.size() && (text[k] == 'e' || text[k] == 'E')) {
    ++k;
    bool negative = false;
    if (k < text.size() && (text[k] == '+' || text[k] == '-')) negative = text[k++] == '-';
    int value = 0;
    bool exponent_digit = false;
    for (; k < text.size() && text[k] >= '0' && text[k] <= '9'; ++k) {
      exponent_digit = true;
      value = std::min(value * 10 + (text[k] - '0'), 100000);
    }
    if (!exponent_digit) return false;
    out.exponent += negative ? -value : value;
  }
  return k == text.size();
}

// floor(decimal * multiplier), or -1 when it exceeds int64. digits < 10^19 and
// multiplier < 2^63, so their product fits in 127 bits.
std::int64_t scaled(const Decimal& number, std::int64_t multiplier) {
  if (number.digits == 0 || multiplier == 0) return 0;
  Wide numerator = number.digits * multiplier;
  Wide denominator = 1;
  for (int exponent = number.exponent; exponent > 0; --exponent) {
    if (numerator > kMaxResult) return -1;
    numerator *= 10;
  }
  for (int exponent = number.exponent; exponent < 0; ++exponent) {
    if (denominator > numerator) return 0;  // below one byte
    denominator *= 10;
  }
  const Wide result = numerator / denominator;
  return result > kMaxResult ? -1 : static_cast<std::int64_t>(result);
}

std::string trimmed(std::string_view text) {
  std::size_t a = 0, b = text.size();
  while (a < b && std::isspace(static_cast<unsigned char>(text[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(text[b - 1]))) --b;
  return std::string(text.substr(a, b - a));
}

// A minus sign before a number ("-5", "-.5"), not a lone "-" or "-%": those have no number,
// and saying "negative" of them would mislead.
bool negative_number(std::string_view text) {
  if (text.size() < 2 || text[0] != '-') return false;
  const std::size_t digit = text[1] == '.' ? 2 : 1;
  return digit < text.size() && std::isdigit(static_cast<unsigned char>(text[digit]));
}

}  // namespace

std::int64_t scale_decimal(std::string_view text, std::int64_t whole, std::string_view what) {
  const std::string number = trimmed(text);
  Decimal decimal;
  REMAT_CHECK(!number.empty(), "bad ", what, " '", text, "': no number");
  REMAT_CHECK(!negative_number(number), "bad ", what, " '", text, "': must not be negative");
  REMAT_CHECK(parse_decimal(number, decimal), "bad ", what, " '", text,
              "': expected a decimal number");
  const std::int64_t result = scaled(decimal, whole);
  REMAT_CHECK(result >= 0, "bad ", what, " '", text, "': too large");
  return result;
}

namespace {

bool is_min(std::string_view text) {
  const std::string word = trimmed(text);
  return word.size() == 3 && std::tolower(static_cast<unsigned char>(word[0])) == 'm' &&
         std::tolower(static_cast<unsigned char>(word[1])) == 'i' &&
         std::tolower(static_cast<unsigned char>(word[2])) == 'n';
}

// The budget before a trailing '+', checked: "+" alone and "min+" say what is wrong.
std::string before_plus(std::string_view text) {
  const std::string rest = trimmed(text.substr(0, text.find_last_of('+')));
  REMAT_CHECK(!rest.empty(), "bad budget '", text,
              "': no budget before the '+' (such as 50%+: half the store-all peak, or the least "
              "budget if more)");
  REMAT_CHECK(!is_min(rest), "bad budget '", text, "': min is already the least budget; write min");
  REMAT_CHECK(rest.back() != '+', "bad budget '", text, "': one '+' at the end");
  return rest;
}

}  // namespace

bool budget_needs_least(std::string_view text) {
  const std::string word = trimmed(text);
  return is_min(word) || (!word.empty() && word.back() == '+');
}

void check_budget_syntax(std::string_view text) {
  if (is_min(text)) return;
  const std::string word = trimmed(text);
  (void)parse_budget(!word.empty() && word.back() == '+' ? before_plus(word) : text, 1);
}

std::int64_t parse_budget(std::string_view text, std::int64_t store_all_peak_bytes,
                          const std::function<std::int64_t()>& least_feasible) {
  if (!budget_needs_least(text)) return parse_budget(text, store_all_peak_bytes);
  const std::string word = trimmed(text);
  if (is_min(word)) {
    const std::int64_t least = least_feasible();
    return least >= 0 ? least : std::numeric_limits<std::int64_t>::max();
  }
  const std::int64_t given = parse_budget(before_plus(word), store_all_peak_bytes);
  return std::max(given, least_feasible());
}

std::int64_t parse_budget(std::string_view text, std::int64_t store_all_peak_bytes) {
  REMAT_CHECK(!budget_needs_least(text), "budget '", text,
              "' depends on the chain's least feasible budget, which is not known here");
  if (!text.empty() && text.back() == '%') {
    REMAT_CHECK(!trimmed(text.substr(0, text.size() - 1)).empty(), "bad budget '", text,
                "': no number before the '%' (a percentage of the store-all peak, such as 50%)");
    // floor(percent / 100 * peak), exactly.
    try {
      return scale_decimal(text.substr(0, text.size() - 1), store_all_peak_bytes, "budget") / 100;
    } catch (const std::invalid_argument& error) {
      const std::string message = error.what();
      const auto reason = message.find("': ");
      throw std::invalid_argument(
          "bad budget '" + std::string(text) +
          "': " + (reason == std::string::npos ? message : message.substr(reason + 3)) +
          " (a percentage of the store-all peak, such as 50%)");
    }
  }
  try {
    return parse_size(text);
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(std::string(error.what()) +
                                " (or a percentage of the store-all peak, such as 50%, or min)");
  }
}

std::int64_t parse_size(std::string_view text) {
  const std::string input = trimmed(text);
  REMAT_CHECK(!input.empty(), "bad size '", text,
              "': empty; expected a number with an optional unit such as 700MiB, 2.5GiB or 1e9");
  REMAT_CHECK(!negative_number(input), "bad size '", text, "': must not be negative");
  std::size_t split = 0;
  while (split < input.size() &&
         (std::isdigit(static_cast<unsigned char>(input[split])) || input[split] == '.' ||
          ((input[split] == 'e' || input[split] == 'E') && split > 0 && split + 1 < input.size() &&
           (std::isdigit(static_cast<unsigned char>(input[split + 1])) || input[split + 1] == '-' ||
            input[split + 1] == '+')) ||
          ((input[split] == '-' || input[split] == '+') && split > 0 &&
           (input[split - 1] == 'e' || input[split - 1] == 'E'))))
    ++split;
  // "1e", "1e+", "2eMiB": an exponent without digits (no unit starts with e).
  const bool exponent_without_digits =
      split > 0 && ((split < input.size() && (input[split] == 'e' || input[split] == 'E')) ||
                    input[split - 1] == '+' || input[split - 1] == '-');
  REMAT_CHECK(!exponent_without_digits, "bad size '", text,
              "': the exponent after 'e' has no digits (such as 1e9 or 2.5e-3GB)");
  Decimal number;
  REMAT_CHECK(split > 0 && parse_decimal(std::string_view(input).substr(0, split), number),
              "bad size '", text, "': expected a number with an optional unit ",
              "such as 700MiB, 2.5GiB or 1e9");
  const std::string unit = trimmed(std::string_view(input).substr(split));
  struct Unit {
    const char* name;
    std::int64_t scale;
  };
  static const Unit kUnits[] = {
      {"", 1},
      {"B", 1},
      {"kB", 1000},
      {"KB", 1000},
      {"MB", 1000000},
      {"GB", 1000000000},
      {"TB", 1000000000000},
      {"KiB", std::int64_t{1} << 10},
      {"MiB", std::int64_t{1} << 20},
      {"GiB", std::int64_t{1} << 30},
      {"TiB", std::int64_t{1} << 40},
      {"k", std::int64_t{1} << 10},
      {"K", std::int64_t{1} << 10},
      {"M", std::int64_t{1} << 20},
      {"G", std::int64_t{1} << 30},
      {"T", std::int64_t{1} << 40},
  };
  std::int64_t scale = 0;
  for (const Unit& candidate : kUnits) {
    if (unit == candidate.name) scale = candidate.scale;
  }
  REMAT_CHECK(scale > 0, "bad size '", text, "': unknown unit '", unit,
              "' (use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB)");
  const std::int64_t bytes = scaled(number, scale);
  REMAT_CHECK(bytes >= 0, "bad size '", text, "': too large");
  return bytes;
}

std::string format_bytes(std::int64_t bytes) {
  static const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::fabs(value) >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[64];
  if (unit == 0) {
    std::snprintf(buffer, sizeof buffer, "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(buffer, sizeof buffer, "%.2f %s", value, kNames[unit]);
  }
  return buffer;
}

std::string format_bytes_exact(std::int64_t bytes) {
  return format_bytes(bytes) + " (" + std::to_string(bytes) + (bytes == 1 ? " byte)" : " bytes)");
}

}  // namespace remat
