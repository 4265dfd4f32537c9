// Sizes and budgets as people write them, and the text remat shows people: messages for
// degenerate input, exact byte counts, signed percentages, names made safe to print.
#include "remat/base/units.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "remat/base/text.h"

using Catch::Contains;

namespace {
// The message `read(text)` refuses `text` with, or "(accepted)".
template <typename Read>
std::string refusal(Read read, const std::string& text) {
  try {
    read(text);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "(accepted)";
}
std::string budget_error(const std::string& text) {
  return refusal([](const std::string& t) { remat::parse_budget(t, 1000); }, text);
}
std::string syntax_error(const std::string& text) {
  return refusal([](const std::string& t) { remat::check_budget_syntax(t); }, text);
}
}  // namespace

TEST_CASE("degenerate budgets are refused with what is wrong with them", "[base][units]") {
  struct Case {
    std::string text, says;
  };
  for (const Case& c : std::vector<Case>{
           {"%", "bad budget '%': no number before the '%'"},
           {" %", "no number before the '%'"},
           {"%%", "bad budget '%%': expected a decimal number"},
           {"-%", "bad budget '-%': expected a decimal number"},
           {"-5%", "bad budget '-5%': must not be negative"},
           {"", "bad size '': empty"},
           {" ", "bad size ' ': empty"},
           {"MiB", "bad size 'MiB': expected a number with an optional unit"},
           {"-", "bad size '-': expected a number with an optional unit"},
           {"-MiB", "bad size '-MiB': expected a number with an optional unit"},
           {"-5", "bad size '-5': must not be negative"},
           {"-.5GiB", "bad size '-.5GiB': must not be negative"},
           {"1e", "bad size '1e': the exponent after 'e' has no digits"},
           {"1e-", "the exponent after 'e' has no digits"},
           {"2EMiB", "the exponent after 'e' has no digits"},
           {".", "bad size '.': expected a number with an optional unit"},
           {"1.2.3", "expected a number with an optional unit"},
           {"12 parsecs", "unknown unit 'parsecs'"},
       }) {
    INFO("budget '" << c.text << "'");
    const std::string error = budget_error(c.text);
    CHECK_THAT(error, Contains(c.says));
    CHECK_THAT(error, Contains("percentage of the store-all peak"));
    if (c.says.find("negative") == std::string::npos) CHECK_THAT(error, !Contains("negative"));
  }
  // What is well-formed still parses.
  CHECK(remat::parse_budget("50%", 1000) == 500);
  CHECK(remat::parse_budget(" 50 %", 1000) == 500);
  CHECK(remat::parse_budget("1e3", 1000) == 1000);
  CHECK(remat::parse_budget("2.5e-3GB", 1000) == 2500000);
  CHECK(remat::parse_budget("1E1KiB", 1000) == 10240);
  CHECK(remat::parse_budget(".5%", 1000) == 5);
}

TEST_CASE("min and a budget followed by + come from the least feasible budget", "[base][units]") {
  int asked = 0;
  const auto least = [&](std::int64_t bytes) {
    return [&asked, bytes] {
      ++asked;
      return bytes;
    };
  };
  // min is the least; a budget followed by + is raised to it, never lowered.
  CHECK(remat::parse_budget("min", 1000, least(321)) == 321);
  CHECK(remat::parse_budget(" MIN ", 1000, least(321)) == 321);
  CHECK(remat::parse_budget("50%+", 1000, least(321)) == 500);
  CHECK(remat::parse_budget("20%+", 1000, least(321)) == 321);
  CHECK(remat::parse_budget("20 % +", 1000, least(321)) == 321);
  CHECK(remat::parse_budget("1KiB+", 1000, least(321)) == 1024);
  CHECK(remat::parse_budget("100+", 1000, least(321)) == 321);
  CHECK(asked == 7);
  // The least is asked for only when needed.
  CHECK(remat::parse_budget("50%", 1000, least(321)) == 500);
  CHECK(asked == 7);
  // No budget is enough (-1): min is the largest (its solve says why), 50%+ is 50%.
  CHECK(remat::parse_budget("min", 1000, least(-1)) == std::numeric_limits<std::int64_t>::max());
  CHECK(remat::parse_budget("50%+", 1000, least(-1)) == 500);

  CHECK(remat::budget_needs_least("min"));
  CHECK(remat::budget_needs_least("50%+ "));
  CHECK_FALSE(remat::budget_needs_least("50%"));
  CHECK_FALSE(remat::budget_needs_least("minimum"));
  CHECK_NOTHROW(remat::check_budget_syntax("min"));
  CHECK_NOTHROW(remat::check_budget_syntax("50%+"));
  CHECK_NOTHROW(remat::check_budget_syntax("700MiB+"));

  // Without the least, or malformed, they are refused, saying what is wrong.
  CHECK_THAT(budget_error("min"), Contains("depends on the chain's least feasible budget"));
  CHECK_THAT(budget_error("50%+"), Contains("depends on the chain's least feasible budget"));
  CHECK_THAT(syntax_error("+"), Contains("bad budget '+': no budget before the '+'"));
  CHECK_THAT(syntax_error("min+"), Contains("min is already the least budget; write min"));
  CHECK_THAT(syntax_error("50%++"), Contains("one '+' at the end"));
  CHECK_THAT(syntax_error("minimum"), Contains("bad size 'minimum'"));
  CHECK_THAT(syntax_error("x%+"), Contains("bad budget 'x%'"));
  CHECK_THAT(syntax_error("7 parsecs+"), Contains("unknown unit 'parsecs'"));
}

TEST_CASE("exact byte counts say byte for one", "[base][units]") {
  CHECK(remat::format_bytes_exact(1) == "1 B (1 byte)");
  CHECK(remat::format_bytes_exact(0) == "0 B (0 bytes)");
  CHECK(remat::format_bytes_exact(50) == "50 B (50 bytes)");
  CHECK(remat::format_bytes_exact(5053184) == "4.82 MiB (5053184 bytes)");
}

TEST_CASE("signed percentages never read -0.0%", "[base][units]") {
  CHECK(remat::format_signed_percent(11.34) == "+11.3%");
  CHECK(remat::format_signed_percent(-2.0) == "-2.0%");
  CHECK(remat::format_signed_percent(0.0) == "+0.0%");
  CHECK(remat::format_signed_percent(-0.0) == "+0.0%");
  CHECK(remat::format_signed_percent(-1e-13) == "+0.0%");
  CHECK(remat::format_signed_percent(-0.049) == "+0.0%");
  CHECK(remat::format_signed_percent(-0.06) == "-0.1%");
  CHECK(remat::format_signed_percent(-0.4, 0) == "+0%");
  CHECK(remat::format_signed_percent(-0.6, 0) == "-1%");
  CHECK(remat::format_signed_percent(std::nan("")) != "+0.0%");
}

TEST_CASE("printable escapes what a terminal or an XML reader must not see", "[base][units]") {
  CHECK(remat::printable("resnet18 b32, caf\xc3\xa9 \xf0\x9f\x99\x82") ==
        "resnet18 b32, caf\xc3\xa9 \xf0\x9f\x99\x82");
  CHECK(remat::printable("a\x1b[2J\x07\x7f") == "a\\x1b[2J\\x07\\x7f");
  CHECK(remat::printable("line\nnext\ttab\r") == "line\\nnext\\ttab\\x0d");
  CHECK(remat::printable(std::string("nul\0", 4)) == "nul\\x00");
  CHECK(remat::printable("\xc2\x9b"
                         "31m") == "\\xc2\\x9b31m");  // C1 CSI
  CHECK(remat::printable("\xef\xbf\xbe\xef\xbf\xbf") ==
        "\\xef\\xbf\\xbe\\xef\\xbf\\xbf");                    // U+FFFE/F
  CHECK(remat::printable("\xef\xbf\xbd") == "\xef\xbf\xbd");  // U+FFFD is a character
  CHECK(remat::printable("\xff x \xc3") == "\\xff x \\xc3");  // not UTF-8, truncated
  CHECK(remat::printable("\xc0\xaf") == "\\xc0\\xaf");        // overlong
  CHECK(remat::printable("\xe0\x80\xaf") == "\\xe0\\x80\\xaf");
  CHECK(remat::printable("\xed\xa0\x80") == "\\xed\\xa0\\x80");           // a surrogate
  CHECK(remat::printable("\xf4\x90\x80\x80") == "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  CHECK(remat::printable("\xf4\x8f\xbf\xbd") == "\xf4\x8f\xbf\xbd");      // U+10FFFD
}

TEST_CASE("shortened and quoted cut long text at a character and say how long it was",
          "[base][units]") {
  CHECK(remat::shortened("abcdef", 3) == "abc... (6 bytes)");
  CHECK(remat::shortened("abc", 3) == "abc");
  CHECK(remat::shortened("", 0) == "");
  CHECK(remat::quoted("abcdef", 3) == "'abc...' (6 bytes)");
  CHECK(remat::quoted("abc", 3) == "'abc'");
  // Cut before a character rather than inside it: "\xc3\xa9" (é) is kept whole or left out.
  CHECK(remat::shortened("caf\xc3\xa9s", 4) == "caf... (6 bytes)");
  CHECK(remat::shortened("caf\xc3\xa9s", 5) == "caf\xc3\xa9... (6 bytes)");
  // What is kept is printable; the count is of the whole text, escapes not counted.
  CHECK(remat::shortened("\x1b[2J and more", 4) == "\\x1b[2J... (13 bytes)");
  CHECK(remat::quoted(std::string("a\0b", 3), 10) == "'a\\x00b'");
  CHECK(remat::shortened(std::string(100000, 'n'), 200) ==
        std::string(200, 'n') + "... (100000 bytes)");
}

TEST_CASE("sizes are parsed with units", "[base][units]") {
  CHECK(remat::parse_size("700MiB") == 700LL << 20);
  CHECK(remat::parse_size("2.5GiB") == 2684354560LL);
  CHECK(remat::parse_size("1e9") == 1000000000LL);
  CHECK(remat::parse_size("1e9B") == 1000000000LL);
  CHECK(remat::parse_size("512kB") == 512000);
  CHECK(remat::parse_size("3 KiB") == 3072);
  CHECK(remat::parse_size("1.5") == 1);  // fractional bytes round down
  CHECK(remat::parse_size("2G") == 2LL << 30);
  CHECK_THROWS_WITH(remat::parse_size("12 parsecs"), Catch::Contains("unknown unit 'parsecs'"));
  CHECK_THROWS_WITH(remat::parse_size("-5MiB"), Catch::Contains("must not be negative"));
  CHECK_THROWS_WITH(remat::parse_size("MiB"), Catch::Contains("expected a number"));
  CHECK_THROWS_WITH(remat::parse_size("1e30"), Catch::Contains("too large"));
  CHECK(remat::format_bytes(512) == "512 B");
  CHECK(remat::format_bytes(700LL << 20) == "700.00 MiB");
  CHECK(remat::format_bytes(2684354560LL) == "2.50 GiB");
}
