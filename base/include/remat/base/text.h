#pragma once
/// Text for people: names from a chain file made safe to show, and signed percentages. The
/// CLI's terminal output and the SVG pictures (remat/report) share these, so that a name
/// reads the same in both.

#include <cstdint>
#include <string>

namespace remat {

/// `text` safe to show on a terminal or in XML: control characters (C0 but for tab and
/// newline, DEL, the C1 controls U+0080-U+009F), which a chain file's names or a command line
/// could use to move the cursor, retitle the window or hide text, and the bytes that are not
/// well-formed UTF-8 (stray continuation bytes, truncated or overlong sequences, surrogates,
/// code points above U+10FFFF) and the non-characters U+FFFE and U+FFFF, which XML 1.0
/// forbids even as references, written as \n, \t or \xNN per byte; printable text, UTF-8
/// included, as it is. Example: `printable("a\x1b[2J") == "a\\x1b[2J"`.
std::string printable(const std::string& text);

/// At most `limit` bytes of a text from a file or a command line, as a message quotes it:
/// cut at a UTF-8 character's start, printable(), and where cut followed by "... (N bytes)",
/// N the whole text's size, so that a name of 100,000 bytes is not 100 KB of stderr:
/// `shortened("abcdef", 3) == "abc... (6 bytes)"`, `shortened("abc", 3) == "abc"`.
std::string shortened(const std::string& text, std::size_t limit);

/// The same in single quotes, the count after the closing one:
/// `quoted("abcdef", 3) == "'abc...' (6 bytes)"`, `quoted("abc", 3) == "'abc'"`.
std::string quoted(const std::string& text, std::size_t limit);

/// A relative change in percent with its sign and `decimals` decimals ("+11.3%", "-2.0%"), and
/// "+0.0%" for every value that rounds to zero: never "-0.0%".
std::string format_signed_percent(double percent, int decimals = 1);

/// `n` and `noun`, the noun plural unless n is 1: `counted(1, "stage") == "1 stage"`,
/// `counted(3, "stage") == "3 stages"`.
std::string counted(std::int64_t n, const std::string& noun);

}  // namespace remat
