#include "remat/base/text.h"

#include <cmath>
#include <cstdio>
#include <utility>

namespace remat {
namespace {

// The length of the well-formed UTF-8 sequence at `i` (RFC 3629, table 3-7 of the Unicode
// standard), or 0: a stray continuation byte, a truncated or overlong sequence, a surrogate,
// a code point above U+10FFFF (bytes a Latin-1 terminal would read as C1 controls, and that
// an XML reader rejects).
std::size_t utf8_sequence(const std::string& text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  std::size_t n = 0;
  unsigned char low = 0x80, high = 0xbf;  // the second byte's range
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) low = 0xa0;   // overlong
    if (c == 0xed) high = 0x9f;  // surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) low = 0x90;   // overlong
    if (c == 0xf4) high = 0x8f;  // above U+10FFFF
  }
  if (n == 0 || i + n > text.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
  return n;
}

}  // namespace

std::string printable(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  const auto hex = [&](unsigned char c) {
    static const char digits[] = "0123456789abcdef";
    out += "\\x";
    out += digits[c >> 4];
    out += digits[c & 15];
  };
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      hex(c);
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (const std::size_t n = utf8_sequence(text, i); n > 0) {
      const auto second = static_cast<unsigned char>(text[i + 1]);
      const bool c1_control = c == 0xc2 && second < 0xa0;  // U+0080-U+009F
      const bool non_character =
          c == 0xef && second == 0xbf && static_cast<unsigned char>(text[i + 2]) >= 0xbe;
      for (std::size_t k = 0; k < n; ++k) {
        if (c1_control || non_character) {
          hex(static_cast<unsigned char>(text[i + k]));
        } else {
          out += text[i + k];
        }
      }
      i += n;
      continue;
    } else {
      hex(c);
    }
    ++i;
  }
  return out;
}

namespace {
// The first at most `limit` bytes of `text`, cut at a character's start, and the count that
// follows where it was cut ("" where it was not).
std::pair<std::string, std::string> cut(const std::string& text, std::size_t limit) {
  if (text.size() <= limit) return {text, ""};
  std::size_t at = limit;
  while (at > 0 && (static_cast<unsigned char>(text[at]) & 0xc0) == 0x80) --at;
  return {text.substr(0, at), " (" + counted(static_cast<std::int64_t>(text.size()), "byte") + ")"};
}
}  // namespace

std::string shortened(const std::string& text, std::size_t limit) {
  const auto [head, count] = cut(text, limit);
  return printable(head) + (count.empty() ? "" : "..." + count);
}

std::string quoted(const std::string& text, std::size_t limit) {
  const auto [head, count] = cut(text, limit);
  return "'" + printable(head) + (count.empty() ? "'" : "...'" + count);
}

std::string counted(std::int64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

std::string format_signed_percent(double percent, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%+.*f%%", decimals, percent);
  // A value that prints as zero prints as +0: "-0.0%" would claim a gain that is only rounding.
  bool zero = std::isfinite(percent);
  for (const char* p = buffer; *p != '\0'; ++p) zero = zero && (*p < '1' || *p > '9');
  if (zero) std::snprintf(buffer, sizeof buffer, "%+.*f%%", decimals, 0.0);
  return buffer;
}

}  // namespace remat
