// Text from untrusted input made safe to print: error messages that quote a graph file,
// and tcap-inspect's output. Internal (used by the JSON reader, the interpreter and
// tcap-inspect).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tcap::ir {

// The longest error message tcap builds from a graph: a parser's context or a quoted key
// can be megabytes long, and one line is all an error needs.
constexpr size_t kMaxMessageBytes = 512;

namespace detail {
// Length of the well-formed UTF-8 sequence at s[i] that is not a control character
// (C1, U+0080-U+009F), or 0.
inline size_t printable_utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  size_t n = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
  }
  if (n == 2 && c == 0xC2 && b(1) < 0xA0) return 0;           // C1 control characters
  if (n == 3 && c == 0xE0 && b(1) < 0xA0) return 0;           // overlong
  if (n == 3 && c == 0xED && b(1) >= 0xA0) return 0;          // surrogates
  if (n == 4 && c == 0xF0 && b(1) < 0x90) return 0;           // overlong
  if (n == 4 && c == 0xF4 && b(1) >= 0x90) return 0;          // past U+10FFFF
  return n;
}
}  // namespace detail

// `s` with every control character (C0, DEL, C1) and every byte that is not part of
// well-formed UTF-8 written as \xNN (newline and tab kept when `keep_lines`), cut to at
// most `max_bytes` bytes, the cut marked by "...".
inline std::string printable(std::string_view s, size_t max_bytes = SIZE_MAX, bool keep_lines = false) {
  static constexpr char kHex[] = "0123456789abcdef";
  const size_t room = max_bytes < 3 ? 0 : max_bytes - 3;  // what is left before a "..."
  std::string out;
  size_t cut = 0;  // the longest prefix of whole pieces that fits in `room`
  for (size_t i = 0; i < s.size() && out.size() <= max_bytes;) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 1;
    if ((c >= 0x20 && c < 0x7F) || (keep_lines && (c == '\n' || c == '\t'))) {
      out += static_cast<char>(c);
    } else if (c >= 0x80 && (n = detail::printable_utf8_length(s, i)) > 0) {
      out.append(s.substr(i, n));
    } else {
      n = 1;
      out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
    }
    i += n;
    if (out.size() <= room) cut = out.size();
  }
  if (out.size() <= max_bytes) return out;
  out.resize(cut);
  return out + "...";
}

}  // namespace tcap::ir
