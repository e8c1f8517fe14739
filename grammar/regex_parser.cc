#include "grammar/regex_parser.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grammar/ebnf_parser.h"

namespace mmserve::grammar {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};

Ranges Complement(const Ranges& in) {
  Ranges sorted = in;
  std::sort(sorted.begin(), sorted.end());
  Ranges out;
  uint32_t next = 0;
  for (const auto& r : sorted) {
    if (r.first > next) out.push_back({next, r.first - 1});
    next = std::max(next, r.second + 1);
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

constexpr int kMaxNesting = 100;

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  absl::StatusOr<ParsedRegex> Parse() {
    ParsedRegex out;
    if (Peek() == '^') {
      out.anchored_start = true;
      ++pos_;
    }
    out.expr = Alternatives();
    if (error_.ok() && !AtEnd()) {
      if (Peek() == ')') Error("unbalanced )");
      if (Peek() == '$') Error("$ is only supported at the end");
    }
    if (!error_.ok()) return error_;
    out.anchored_end = anchored_end_;
    return out;
  }

 private:
  bool AtEnd() const { return pos_ >= p_.size(); }
  char Peek() const { return AtEnd() ? '\0' : p_[pos_]; }

  void Error(std::string_view what, size_t at) {
    if (error_.ok()) {
      error_ = absl::InvalidArgumentError(absl::StrCat("regex: ", std::string(what), " at ", at));
    }
  }
  void Error(std::string_view what) { Error(what, pos_); }

  Expr Alternatives() {
    std::vector<Expr> alts = {Sequence()};
    while (error_.ok() && Peek() == '|') {
      ++pos_;
      alts.push_back(Sequence());
    }
    return Expr::Alt(std::move(alts));
  }

  Expr Sequence() {
    std::vector<Expr> items;
    while (error_.ok() && !AtEnd()) {
      const char c = Peek();
      if (c == '|' || c == ')') break;
      if (c == '$') {
        if (pos_ + 1 == p_.size()) {
          anchored_end_ = true;
          ++pos_;
        } else {
          Error("$ is only supported at the end");
        }
        break;
      }
      if (c == '^') {
        Error("^ is only supported at the start");
        break;
      }
      Expr atom = Atom();
      if (!error_.ok()) break;
      items.push_back(Quantified(std::move(atom)));
    }
    return Expr::Seq(std::move(items));
  }

  Expr Atom() {
    const size_t start = pos_;
    const char c = Peek();
    if (c == '(') {
      if (++depth_ > kMaxNesting) {
        Error(absl::StrCat("groups nested deeper than ", kMaxNesting));
        return Expr::Empty();
      }
      ++pos_;
      if (Peek() == '?') {
        ++pos_;
        const char k = Peek();
        if (k == ':') {
          ++pos_;
        } else if (k == 'P' || (k == '<' && pos_ + 1 < p_.size() && p_[pos_ + 1] != '=' &&
                                p_[pos_ + 1] != '!')) {
          if (k == 'P') ++pos_;
          if (Peek() != '<') {
            Error("unsupported group syntax", start);
            return Expr::Empty();
          }
          while (!AtEnd() && Peek() != '>') ++pos_;
          ++pos_;
        } else if (k == '=' || k == '!' || k == '<') {
          Error("lookaround is not supported", start);
          return Expr::Empty();
        } else {
          Error("inline flags and other (? groups are not supported", start);
          return Expr::Empty();
        }
      }
      Expr inner = Alternatives();
      --depth_;
      if (error_.ok() && Peek() != ')') Error("unbalanced (", start);
      ++pos_;
      return inner;
    }
    if (c == '[') return Class();
    if (c == '.') {
      ++pos_;
      return Expr::Class({{'\n', '\n'}}, true);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') {
      Error("nothing to repeat");
      return Expr::Empty();
    }
    if (c == '\\') {
      Ranges ranges;
      bool is_class = false;
      const int32_t cp = Escape(ranges, is_class);
      if (is_class) return Expr::Class(std::move(ranges), false);
      std::string bytes;
      if (cp >= 0) AppendUtf8(cp, bytes);
      return Expr::Bytes(std::move(bytes));
    }
    std::string bytes(1, Literal());
    bytes += Continuation();
    return Expr::Bytes(std::move(bytes));
  }

  // The rest of a multi-byte UTF-8 character begun by the byte just read.
  std::string Continuation() {
    std::string rest;
    while (!AtEnd() && (static_cast<uint8_t>(Peek()) & 0xC0) == 0x80) {
      rest += Peek();
      ++pos_;
    }
    return rest;
  }
  char Literal() { return p_[pos_++]; }

  // A code point of a class member or literal (not an escape).
  int32_t ClassCodePoint() {
    size_t len = 0;
    const int32_t cp = DecodeUtf8(std::string(p_.substr(pos_, 4)), len);
    if (cp < 0) Error("invalid UTF-8");
    pos_ += len;
    return cp;
  }

  // After a backslash: a code point, or a class into `ranges`.
  int32_t Escape(Ranges& ranges, bool& is_class) {
    const size_t start = pos_;
    ++pos_;
    if (AtEnd()) {
      Error("trailing backslash", start);
      return -1;
    }
    const char e = p_[pos_++];
    is_class = true;
    switch (e) {
      case 'd':
        ranges = kDigit;
        return -1;
      case 'D':
        ranges = Complement(kDigit);
        return -1;
      case 'w':
        ranges = kWord;
        return -1;
      case 'W':
        ranges = Complement(kWord);
        return -1;
      case 's':
        ranges = kSpace;
        return -1;
      case 'S':
        ranges = Complement(kSpace);
        return -1;
      default:
        break;
    }
    is_class = false;
    if (const int32_t c = ControlEscape(e); c >= 0) return c;
    switch (e) {
      case 'x':
        return Hex(2, start);
      case 'u':
        return Hex(4, start);
      case 'b':
      case 'B':
        Error("word boundaries (\\b, \\B) are not supported", start);
        return -1;
      case 'A':
      case 'Z':
      case 'z':
        Error("anchors inside the pattern are not supported", start);
        return -1;
      case 'k':
        Error("back-references are not supported", start);
        return -1;
      default:
        break;
    }
    if (e >= '1' && e <= '9') {
      Error("back-references are not supported", start);
      return -1;
    }
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) {
      Error(absl::StrCat("unknown escape \\", std::string(1, e)), start);
      return -1;
    }
    --pos_;
    return ClassCodePoint();
  }

  int32_t Hex(int digits, size_t start) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const int h = HexValue(Peek());
      if (h < 0) {
        Error("expected a hex digit", start);
        return -1;
      }
      v = v * 16 + h;
      ++pos_;
    }
    if (v >= 0xD800 && v <= 0xDFFF) {
      Error("escape is a surrogate", start);
      return -1;
    }
    return static_cast<int32_t>(v);
  }

  Expr Class() {
    const size_t start = pos_;
    ++pos_;
    bool negated = false;
    if (Peek() == '^') {
      negated = true;
      ++pos_;
    }
    Ranges ranges;
    bool first = true;
    while (error_.ok()) {
      if (AtEnd()) {
        Error("unterminated character class", start);
        break;
      }
      if (Peek() == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      if (p_.substr(pos_, 2) == "[:") {
        Error("POSIX classes are not supported");
        break;
      }
      bool is_class = false;
      Ranges sub;
      int32_t lo = Peek() == '\\' ? Escape(sub, is_class) : ClassCodePoint();
      if (is_class) {
        ranges.insert(ranges.end(), sub.begin(), sub.end());
        continue;
      }
      int32_t hi = lo;
      if (Peek() == '-' && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        const size_t dash = pos_;
        ++pos_;
        hi = Peek() == '\\' ? Escape(sub, is_class) : ClassCodePoint();
        if (is_class) Error("a class cannot end a range", dash);
        if (error_.ok() && hi < lo) Error("bad character range", dash);
      }
      if (error_.ok()) ranges.push_back({lo, hi});
    }
    return Expr::Class(std::move(ranges), negated);
  }

  Expr Quantified(Expr atom) {
    bool quantified = false;
    while (error_.ok() && !AtEnd()) {
      const size_t at = pos_;
      const char c = Peek();
      int min = 0, max = -1;
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        min = 1;
        ++pos_;
      } else if (c == '?') {
        max = 1;
        ++pos_;
      } else if (c == '{' && Bounds(min, max)) {
      } else {
        break;
      }
      if (Peek() == '?') ++pos_;  // lazy: the same set of strings
      if (Peek() == '+') {
        Error("possessive quantifiers are not supported");
        break;
      }
      if (quantified) {
        Error("multiple repeat", at);
        break;
      }
      quantified = true;
      atom = Expr::Repeat(std::move(atom), min, max);
    }
    return atom;
  }

  // {m} {m,} {m,n} {,n}; false (nothing read) when `{` is a literal.
  bool Bounds(int& min, int& max) {
    const size_t start = pos_;
    size_t i = pos_ + 1;
    const auto number = [&](int& out) {
      const size_t from = i;
      int64_t v = 0;
      while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9') {
        v = std::min<int64_t>(v * 10 + (p_[i] - '0'), kMaxRepeat + 1);
        ++i;
      }
      out = static_cast<int>(v);
      return i > from;
    };
    const bool has_min = number(min);
    if (i < p_.size() && p_[i] == ',') {
      ++i;
      if (!number(max)) max = -1;
    } else {
      if (!has_min) return false;
      max = min;
    }
    if (i >= p_.size() || p_[i] != '}') return false;
    pos_ = i + 1;
    if (min > kMaxRepeat || max > kMaxRepeat) {
      Error(absl::StrCat("repetition count above ", kMaxRepeat), start);
    } else if (max >= 0 && max < min) {
      Error("repetition {m,n} with n < m", start);
    }
    return true;
  }

  std::string_view p_;
  size_t pos_ = 0;
  bool anchored_end_ = false;
  int depth_ = 0;  // open groups
  absl::Status error_;
};

}  // namespace

absl::StatusOr<ParsedRegex> ParseRegex(std::string_view pattern) { return Parser(pattern).Parse(); }

absl::StatusOr<Grammar> RegexGrammar(std::string_view pattern) {
  absl::StatusOr<ParsedRegex> parsed = ParseRegex(pattern);
  if (!parsed.ok()) return parsed.status();
  Grammar g;
  g.rules.push_back({"root", std::move(parsed->expr)});
  return g;
}

}  // namespace mmserve::grammar
