#include "grammar/ebnf_parser.h"

#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace mmserve::grammar {
namespace {

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

constexpr int kMaxNesting = 100;  // groups in groups
constexpr int kMaxPostfix = 4;    // as in "a"*?

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  absl::StatusOr<Grammar> Parse(std::string_view root_rule) {
    while (true) {
      SkipSpace();
      if (AtEnd()) break;
      const size_t name_pos = pos_;
      std::string name = Name();
      if (name.empty()) {
        Error("expected a rule name");
        return error_;
      }
      SkipSpace();
      if (text_.substr(pos_, 3) != "::=") {
        Error("expected \"::=\" after rule name");
        return error_;
      }
      pos_ += 3;
      const int index = RuleIndex(name);
      if (defined_[index]) {
        pos_ = name_pos;
        Error(absl::StrCat("rule \"", name, "\" is defined twice"));
        return error_;
      }
      defined_[index] = true;
      Expr body = Alternatives();
      if (!error_.ok()) return error_;
      grammar_.rules[index].body = std::move(body);
    }
    for (size_t i = 0; i < grammar_.rules.size(); ++i) {
      if (!defined_[i]) {
        pos_ = first_use_[i];
        Error(absl::StrCat("rule \"", grammar_.rules[i].name, "\" is not defined"));
        return error_;
      }
    }
    const auto root = index_.find(std::string(root_rule));
    if (root == index_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ebnf: no rule named \"", std::string(root_rule), "\""));
    }
    grammar_.root = root->second;
    return std::move(grammar_);
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }

  void Error(std::string_view what) {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    if (error_.ok()) {
      error_ = absl::InvalidArgumentError(
          absl::StrCat("ebnf: ", std::string(what), " at ", line, ":", col));
    }
  }

  void SkipSpace() {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == '#') {
        while (!AtEnd() && Peek() != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string Name() {
    const size_t start = pos_;
    while (!AtEnd() && IsNameChar(Peek())) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  int RuleIndex(const std::string& name) {
    auto [it, inserted] = index_.emplace(name, static_cast<int>(grammar_.rules.size()));
    if (inserted) {
      grammar_.rules.push_back({name, Expr::Empty()});
      defined_.push_back(false);
      first_use_.push_back(pos_);
    }
    return it->second;
  }

  // At a rule name followed by "::=": the next rule starts here.
  bool AtRuleStart() {
    const size_t save = pos_;
    const bool named = !Name().empty();
    SkipSpace();
    const bool result = named && text_.substr(pos_, 3) == "::=";
    pos_ = save;
    return result;
  }

  Expr Alternatives() {
    std::vector<Expr> alts = {Sequence()};
    while (error_.ok()) {
      SkipSpace();
      if (Peek() != '|') break;
      ++pos_;
      alts.push_back(Sequence());
    }
    return Expr::Alt(std::move(alts));
  }

  Expr Sequence() {
    std::vector<Expr> items;
    while (error_.ok()) {
      SkipSpace();
      const char c = Peek();
      if (AtEnd() || c == '|' || c == ')' || AtRuleStart()) break;
      Expr item = Primary();
      if (!error_.ok()) break;
      items.push_back(Postfix(std::move(item)));
    }
    return Expr::Seq(std::move(items));
  }

  Expr Primary() {
    const char c = Peek();
    if (c == '"') return Literal();
    if (c == '[') return CharClass();
    if (c == '.') {
      ++pos_;
      return Expr::Class({}, true);
    }
    if (c == '(') {
      if (++depth_ > kMaxNesting) {
        Error(absl::StrCat("groups nested deeper than ", kMaxNesting));
        return Expr::Empty();
      }
      ++pos_;
      Expr inner = Alternatives();
      --depth_;
      SkipSpace();
      if (Peek() != ')') {
        Error("expected \")\"");
        return inner;
      }
      ++pos_;
      return inner;
    }
    if (IsNameChar(c)) {
      const size_t start = pos_;
      std::string name = Name();
      pos_ = start;
      const int index = RuleIndex(name);
      pos_ = start + name.size();
      return Expr::Ref(index);
    }
    Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
    return Expr::Empty();
  }

  // One code point of a literal or class, escapes decoded; -1 on error.
  int32_t CodePoint() {
    if (Peek() != '\\') {
      size_t len = 0;
      const int32_t cp = DecodeUtf8(std::string(text_.substr(pos_, 4)), len);
      if (cp < 0) {
        Error("invalid UTF-8");
        return -1;
      }
      pos_ += len;
      return cp;
    }
    ++pos_;
    const char e = Peek();
    ++pos_;
    if (const int32_t c = ControlEscape(e); c >= 0) return c;
    switch (e) {
      case 'x':
        return Hex(2);
      case 'u':
        return Hex(4);
      case 'U':
        return Hex(8);
      default:
        if (e == '\0' || std::isalnum(static_cast<unsigned char>(e))) {
          --pos_;
          Error(absl::StrCat("unknown escape \\", std::string(1, e)));
          return -1;
        }
        return static_cast<unsigned char>(e);
    }
  }

  int32_t Hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const int h = HexValue(Peek());
      if (h < 0) {
        Error("expected a hex digit");
        return -1;
      }
      v = v * 16 + h;
      ++pos_;
    }
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) {
      Error("escape is not a Unicode scalar value");
      return -1;
    }
    return static_cast<int32_t>(v);
  }

  Expr Literal() {
    ++pos_;
    std::string bytes;
    while (error_.ok()) {
      if (AtEnd()) {
        Error("unterminated string literal");
        break;
      }
      if (Peek() == '"') {
        ++pos_;
        break;
      }
      const int32_t cp = CodePoint();
      if (cp >= 0) AppendUtf8(cp, bytes);
    }
    return bytes.empty() ? Expr::Empty() : Expr::Bytes(std::move(bytes));
  }

  Expr CharClass() {
    ++pos_;
    bool negated = false;
    if (Peek() == '^') {
      negated = true;
      ++pos_;
    }
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    while (error_.ok()) {
      if (AtEnd()) {
        Error("unterminated character class");
        break;
      }
      if (Peek() == ']') {
        ++pos_;
        break;
      }
      const int32_t lo = CodePoint();
      int32_t hi = lo;
      if (Peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        hi = CodePoint();
        if (error_.ok() && hi < lo) Error("character range out of order");
      }
      if (error_.ok()) ranges.push_back({lo, hi});
    }
    if (error_.ok() && ranges.empty() && !negated) {
      Error("empty character class");
    }
    return Expr::Class(std::move(ranges), negated);
  }

  Expr Postfix(Expr item) {
    for (int ops = 0; error_.ok(); ++ops) {
      const char c = Peek();
      if (ops == kMaxPostfix && (c == '*' || c == '+' || c == '?' || c == '{')) {
        Error(absl::StrCat("more than ", kMaxPostfix, " repetition operators on one item"));
        break;
      }
      if (c == '*') {
        item = Expr::Repeat(std::move(item), 0, -1);
      } else if (c == '+') {
        item = Expr::Repeat(std::move(item), 1, -1);
      } else if (c == '?') {
        item = Expr::Repeat(std::move(item), 0, 1);
      } else if (c == '{') {
        ++pos_;
        int min = 0, max = -1;
        if (!Count(min, /*optional=*/true)) break;
        if (Peek() == ',') {
          ++pos_;
          if (Peek() != '}' && !Count(max, false)) break;
        } else {
          max = min;
        }
        if (Peek() != '}') {
          Error("expected \"}\"");
          break;
        }
        if (max >= 0 && max < min) {
          Error("repetition {m,n} with n < m");
          break;
        }
        item = Expr::Repeat(std::move(item), min, max);
      } else {
        break;
      }
      ++pos_;
    }
    return item;
  }

  bool Count(int& value, bool optional) {
    const size_t start = pos_;
    int64_t v = 0;
    while (Peek() >= '0' && Peek() <= '9') {
      v = v * 10 + (Peek() - '0');
      ++pos_;
      if (v > kMaxRepeat) {
        Error(absl::StrCat("repetition count above ", kMaxRepeat));
        return false;
      }
    }
    if (pos_ == start) {
      if (optional) return true;
      Error("expected a repetition count");
      return false;
    }
    value = static_cast<int>(v);
    return true;
  }

  std::string_view text_;
  size_t pos_ = 0;
  absl::Status error_;
  int depth_ = 0;  // open groups
  Grammar grammar_;
  absl::flat_hash_map<std::string, int> index_;
  std::vector<bool> defined_;
  std::vector<size_t> first_use_;
};

}  // namespace

absl::StatusOr<Grammar> ParseEbnf(std::string_view text, std::string_view root_rule) {
  return Parser(text).Parse(root_rule);
}

}  // namespace mmserve::grammar
