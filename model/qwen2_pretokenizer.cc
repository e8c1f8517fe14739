#include "model/qwen2_pretokenizer.h"

#include <cstddef>
#include <cstdint>

#include "model/unicode.h"

namespace mmserve::model {

const char kQwen2SplitPattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

namespace {

// The text decoded once into code points with their byte offsets, so the
// matchers can look ahead freely.
class Cursor {
 public:
  explicit Cursor(absl::string_view text) {
    size_t pos = 0;
    while (pos < text.size()) {
      offsets_.push_back(pos);
      cps_.push_back(NextCodePoint(text, &pos));
    }
    offsets_.push_back(text.size());
  }
  size_t size() const { return cps_.size(); }
  char32_t at(size_t i) const { return i < cps_.size() ? cps_[i] : 0; }
  bool has(size_t i) const { return i < cps_.size(); }
  size_t offset(size_t i) const { return offsets_[i]; }

 private:
  std::vector<char32_t> cps_;
  std::vector<size_t> offsets_;
};

bool IsNewline(char32_t c) { return c == '\r' || c == '\n'; }

char32_t Lower(char32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// (?i:'s|'t|'re|'ve|'m|'ll|'d). U+017F (long s) case-folds to 's' too.
size_t MatchContraction(const Cursor& c, size_t i) {
  if (c.at(i) != '\'') return 0;
  char32_t a = Lower(c.at(i + 1));
  if (a == 's' || a == 0x17f || a == 't' || a == 'm' || a == 'd') return 2;
  char32_t b = Lower(c.at(i + 2));
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// [^\r\n\p{L}\p{N}]?\p{L}+
size_t MatchWord(const Cursor& c, size_t i) {
  size_t j = i;
  if (c.has(j) && !IsNewline(c.at(j)) && !IsLetter(c.at(j)) && !IsNumber(c.at(j))) ++j;
  if (!c.has(j) || !IsLetter(c.at(j))) {
    // Backtrack: the optional character absent.
    j = i;
    if (!c.has(j) || !IsLetter(c.at(j))) return 0;
  }
  while (c.has(j) && IsLetter(c.at(j))) ++j;
  return j - i;
}

// \p{N}
size_t MatchDigit(const Cursor& c, size_t i) { return c.has(i) && IsNumber(c.at(i)) ? 1 : 0; }

// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
size_t MatchPunct(const Cursor& c, size_t i) {
  auto other = [&](size_t k) {
    return c.has(k) && !IsWhitespace(c.at(k)) && !IsLetter(c.at(k)) && !IsNumber(c.at(k));
  };
  size_t j = i;
  if (c.at(j) == ' ' && other(j + 1)) ++j;
  if (!other(j)) return 0;
  while (other(j)) ++j;
  while (c.has(j) && IsNewline(c.at(j))) ++j;
  return j - i;
}

// \s*[\r\n]+ : the whitespace run up to and including its last newline.
size_t MatchNewlines(const Cursor& c, size_t i) {
  size_t end = i;
  size_t last_newline_end = 0;
  while (c.has(end) && IsWhitespace(c.at(end))) {
    if (IsNewline(c.at(end))) last_newline_end = end + 1;
    ++end;
  }
  return last_newline_end > i ? last_newline_end - i : 0;
}

// \s+(?!\S) then \s+ : a whitespace run, leaving its last character for the
// next piece when a non-space follows (so " world" keeps its space).
size_t MatchSpaces(const Cursor& c, size_t i) {
  size_t end = i;
  while (c.has(end) && IsWhitespace(c.at(end))) ++end;
  if (end == i) return 0;
  if (!c.has(end) || end - i == 1) return end - i;
  return end - i - 1;
}

}  // namespace

void SplitQwen2(absl::string_view text, std::vector<absl::string_view>* out) {
  Cursor c(text);
  size_t i = 0;
  while (i < c.size()) {
    size_t n = MatchContraction(c, i);
    if (n == 0) n = MatchWord(c, i);
    if (n == 0) n = MatchDigit(c, i);
    if (n == 0) n = MatchPunct(c, i);
    if (n == 0) n = MatchNewlines(c, i);
    if (n == 0) n = MatchSpaces(c, i);
    if (n == 0) n = 1;  // unreachable: every code point is matched by some class
    out->push_back(text.substr(c.offset(i), c.offset(i + n) - c.offset(i)));
    i += n;
  }
}

}  // namespace mmserve::model
