// The grammar every front end (EBNF, regex, JSON schema) produces: named
// rules whose bodies are expressions over UTF-8 text and rule references.
#ifndef MMSERVE_GRAMMAR_AST_H_
#define MMSERVE_GRAMMAR_AST_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mmserve::grammar {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

struct Expr {
  enum class Kind {
    kEmpty,   // matches ""
    kBytes,   // `bytes` exactly
    kClass,   // one code point in `ranges` (inclusive), or not in them
    kRef,     // rule `rule`
    kSeq,     // `kids` in order
    kAlt,     // one of `kids`
    kRepeat,  // kids[0] between `min` and `max` times (max -1: unbounded)
  };
  Kind kind = Kind::kEmpty;
  std::string bytes;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  bool negated = false;
  int rule = -1;
  std::vector<Expr> kids;
  int min = 0;
  int max = 0;

  static Expr Empty() { return Expr(); }
  static Expr Bytes(std::string b) {
    Expr e;
    e.kind = Kind::kBytes;
    e.bytes = std::move(b);
    return e;
  }
  static Expr Class(std::vector<std::pair<uint32_t, uint32_t>> r, bool neg) {
    Expr e;
    e.kind = Kind::kClass;
    e.ranges = std::move(r);
    e.negated = neg;
    return e;
  }
  static Expr Ref(int rule) {
    Expr e;
    e.kind = Kind::kRef;
    e.rule = rule;
    return e;
  }
  static Expr Seq(std::vector<Expr> kids) { return Group(Kind::kSeq, kids); }
  static Expr Alt(std::vector<Expr> kids) { return Group(Kind::kAlt, kids); }
  static Expr Repeat(Expr kid, int min, int max) {
    Expr e;
    e.kind = Kind::kRepeat;
    e.kids.push_back(std::move(kid));
    e.min = min;
    e.max = max;
    return e;
  }

 private:
  static Expr Group(Kind kind, std::vector<Expr>& kids) {
    if (kids.size() == 1) return std::move(kids[0]);
    Expr e;
    e.kind = kids.empty() ? Kind::kEmpty : kind;
    e.kids = std::move(kids);
    return e;
  }
};

struct Rule {
  std::string name;
  Expr body;
};

// rules[root] is where matching starts.
struct Grammar {
  std::vector<Rule> rules;
  int root = 0;
};

// Appends the UTF-8 encoding of `cp` to `out`.
inline void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// The value of a hex digit; -1 for another character.
inline int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The character of the escapes both grammar dialects share (\n \r \t \f
// \v \0, given the letter after the backslash); -1 for any other.
inline int32_t ControlEscape(char e) {
  switch (e) {
    case 'n':
      return '\n';
    case 'r':
      return '\r';
    case 't':
      return '\t';
    case 'f':
      return '\f';
    case 'v':
      return '\v';
    case '0':
      return 0;
    default:
      return -1;
  }
}

// Decodes one UTF-8 code point of `s` at `pos` (advanced past it); -1 when
// the bytes there are not valid UTF-8.
inline int32_t DecodeUtf8(const std::string& s, size_t& pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t b0 = byte(pos);
  int len = b0 < 0x80                 ? 1
            : b0 >= 0xF0 && b0 < 0xF5 ? 4
            : b0 >= 0xE0              ? 3
            : b0 >= 0xC2 && b0 < 0xE0 ? 2
                                      : 0;
  if (len == 0 || pos + len > s.size()) return -1;
  uint32_t cp = len == 1 ? b0 : b0 & (0x7F >> len);
  for (int i = 1; i < len; ++i) {
    if ((byte(pos + i) & 0xC0) != 0x80) return -1;
    cp = (cp << 6) | (byte(pos + i) & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) {
    return -1;
  }
  pos += len;
  return static_cast<int32_t>(cp);
}

}  // namespace mmserve::grammar

#endif  // MMSERVE_GRAMMAR_AST_H_
