#include "grammar/json_schema_text.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace mmserve::grammar {
namespace {

// The JSON escape of a character that must be escaped in a string.
std::string JsonEscape(uint32_t cp) {
  switch (cp) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    default:
      return absl::StrFormat("\\u%04x", cp);
  }
}

bool MustEscape(uint32_t cp) { return cp < 0x20 || cp == '"' || cp == '\\'; }

std::string ClassPoint(uint32_t cp) {
  if (cp >= 0x20 && cp < 0x7F && cp != ']' && cp != '\\' && cp != '-' && cp != '^') {
    return std::string(1, static_cast<char>(cp));
  }
  return cp <= 0xFFFF ? absl::StrFormat("\\u%04X", cp) : absl::StrFormat("\\U%08X", cp);
}

// Digits of the numbers in [a, b], both `n` digits long (leading zeros
// allowed: the caller fixes the first digit).
std::string SameLengthRange(const std::string& a, const std::string& b) {
  if (a.empty()) return "";
  if (a == std::string(a.size(), '0') && b == std::string(b.size(), '9')) {
    return absl::StrCat("[0-9]{", a.size(), "}");
  }
  const std::string ra = a.substr(1), rb = b.substr(1);
  if (a[0] == b[0]) {
    return absl::StrCat("\"", std::string(1, a[0]), "\" ", SameLengthRange(ra, rb));
  }
  const std::string nines(ra.size(), '9'), zeros(ra.size(), '0');
  std::vector<std::string> alts;
  alts.push_back(absl::StrCat("\"", std::string(1, a[0]), "\" ", SameLengthRange(ra, nines)));
  if (b[0] - a[0] > 1) {
    std::string mid =
        absl::StrCat("[", std::string(1, a[0] + 1), "-", std::string(1, b[0] - 1), "]");
    if (!ra.empty()) absl::StrAppend(&mid, " [0-9]{", ra.size(), "}");
    alts.push_back(mid);
  }
  alts.push_back(absl::StrCat("\"", std::string(1, b[0]), "\" ", SameLengthRange(zeros, rb)));
  return absl::StrCat("(", absl::StrJoin(alts, " | "), ")");
}

// Non-negative integers in [a, b] (b absent: unbounded).
std::string NonNegativeRange(uint64_t a, std::optional<uint64_t> b) {
  std::vector<std::string> alts;
  std::string sa = std::to_string(a);
  const size_t max_len = b ? std::to_string(*b).size() : 0;
  for (size_t len = sa.size();; ++len) {
    if (!b && len > sa.size()) {
      // Every longer number.
      alts.push_back(absl::StrCat("[1-9] [0-9]{", len - 1, ",}"));
      break;
    }
    if (b && len > max_len) break;
    const std::string lo = len == sa.size() ? sa : "1" + std::string(len - 1, '0');
    const std::string hi = b && len == max_len ? std::to_string(*b) : std::string(len, '9');
    alts.push_back(len == 1 ? absl::StrCat("[", lo, "-", hi, "]") : SameLengthRange(lo, hi));
  }
  return absl::StrCat("(", absl::StrJoin(alts, " | "), ")");
}

}  // namespace

std::string EbnfLiteral(std::string_view bytes) {
  std::string out = "\"";
  for (char c : bytes) {
    const auto u = static_cast<uint8_t>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7F) {
      out += absl::StrFormat("\\x%02X", u);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string DumpJson(const nlohmann::ordered_json& value) {
  if (value.is_object()) {
    std::vector<std::string> parts;
    for (const auto& [k, v] : value.items()) {
      parts.push_back(absl::StrCat(DumpJson(k), ": ", DumpJson(v)));
    }
    return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
  }
  if (value.is_array()) {
    std::vector<std::string> parts;
    for (const auto& v : value) parts.push_back(DumpJson(v));
    return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
  }
  if (value.is_string()) {
    std::string out = "\"";
    for (char c : value.get<std::string>()) {
      const auto u = static_cast<uint8_t>(c);
      out += MustEscape(u) ? JsonEscape(u) : std::string(1, c);
    }
    return out + "\"";
  }
  return value.dump();
}

absl::StatusOr<std::string> IntegerRangeEbnf(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (lo && hi && *lo > *hi) {
    return absl::InvalidArgumentError("minimum is above maximum");
  }
  std::vector<std::string> alts;
  // Negative part: -m for m in [max(1, -hi), -lo].
  if (!lo || *lo < 0) {
    const uint64_t m_lo = hi && *hi < 0 ? -static_cast<uint64_t>(*hi) : 1;
    std::optional<uint64_t> m_hi;
    if (lo) m_hi = -static_cast<uint64_t>(*lo);
    alts.push_back(absl::StrCat("\"-\" ", NonNegativeRange(m_lo, m_hi)));
  }
  if (!hi || *hi >= 0) {
    const uint64_t a = lo && *lo > 0 ? *lo : 0;
    std::optional<uint64_t> b;
    if (hi) b = *hi;
    alts.push_back(NonNegativeRange(a, b));
  }
  return absl::StrCat("(", absl::StrJoin(alts, " | "), ")");
}

absl::StatusOr<std::string> FormatEbnf(std::string_view format) {
  static const std::string kYear =
      "([1-9] [0-9]{3} | \"0\" [1-9] [0-9]{2} | \"00\" [1-9] [0-9] | \"000\" "
      "[1-9])";
  static const std::string kLeapYear =
      "([0-9]{2} (\"0\" [48] | [2468] [048] | [13579] [26]) | (\"0\" [48] | "
      "[2468] [048] | [13579] [26]) \"00\")";
  static const std::string kDate =
      absl::StrCat("(", kYear,
                   " \"-\" ((\"01\" | \"03\" | \"05\" | \"07\" | \"08\" | \"10\" | \"12\") "
                   "\"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01]) | (\"04\" | \"06\" | "
                   "\"09\" | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\") | \"02-\" "
                   "(\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8])) | ",
                   kLeapYear, " \"-02-29\")");
  static const std::string kTime =
      "(([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] "
      "(\".\" [0-9]+)? ([Zz] | [+\\-] ([01] [0-9] | \"2\" [0-3]) "
      "\":\" [0-5] [0-9]))";
  if (format == "date") return kDate;
  if (format == "time") return kTime;
  if (format == "date-time") return absl::StrCat(kDate, " [Tt] ", kTime);
  if (format == "uuid") {
    return std::string(
        "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
        "[0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}");
  }
  if (format == "email") {
    return std::string(
        "[a-zA-Z0-9_%+\\-]+ (\".\" [a-zA-Z0-9_%+\\-]+)* \"@\" "
        "[a-zA-Z0-9\\-]+ (\".\" [a-zA-Z0-9\\-]+)+");
  }
  return absl::NotFoundError(std::string(format));
}

std::string JsonEscapedEbnf(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kEmpty:
    case Expr::Kind::kRef:
      return "\"\"";
    case Expr::Kind::kBytes: {
      std::string text;
      for (size_t pos = 0; pos < e.bytes.size();) {
        const int32_t cp = DecodeUtf8(e.bytes, pos);
        if (cp < 0) break;
        if (MustEscape(cp)) {
          text += JsonEscape(cp);
        } else {
          AppendUtf8(cp, text);
        }
      }
      return EbnfLiteral(text);
    }
    case Expr::Kind::kClass: {
      std::vector<std::pair<uint32_t, uint32_t>> ranges = e.ranges;
      std::sort(ranges.begin(), ranges.end());
      if (e.negated) {
        std::vector<std::pair<uint32_t, uint32_t>> comp;
        uint32_t next = 0;
        for (const auto& r : ranges) {
          if (r.first > next) comp.push_back({next, r.first - 1});
          next = std::max(next, r.second + 1);
        }
        if (next <= kMaxCodePoint) comp.push_back({next, kMaxCodePoint});
        ranges = std::move(comp);
      }
      std::vector<std::string> alts;
      std::string cls;
      for (const auto& [lo, hi] : ranges) {
        for (uint32_t cp = lo; cp <= std::min<uint32_t>(hi, 0x5C); ++cp) {
          if (MustEscape(cp)) alts.push_back(EbnfLiteral(JsonEscape(cp)));
        }
        // The part of [lo, hi] that is written as itself.
        uint32_t start = std::max<uint32_t>(lo, 0x20);
        while (start <= hi) {
          uint32_t end = hi;
          if (start <= '"' && end >= '"') end = start == '"' ? start : '"' - 1;
          if (start <= '\\' && end >= '\\') {
            end = start == '\\' ? start : '\\' - 1;
          }
          if (!MustEscape(start)) {
            absl::StrAppend(&cls, ClassPoint(start));
            if (end > start) absl::StrAppend(&cls, "-", ClassPoint(end));
          }
          start = end + 1;
        }
      }
      if (!cls.empty()) alts.push_back(absl::StrCat("[", cls, "]"));
      if (alts.empty()) return "[^\\x00-\\U0010FFFF]";
      return absl::StrCat("(", absl::StrJoin(alts, " | "), ")");
    }
    case Expr::Kind::kSeq:
    case Expr::Kind::kAlt: {
      std::vector<std::string> parts;
      for (const Expr& kid : e.kids) parts.push_back(JsonEscapedEbnf(kid));
      return absl::StrCat("(", absl::StrJoin(parts, e.kind == Expr::Kind::kSeq ? " " : " | "), ")");
    }
    case Expr::Kind::kRepeat: {
      std::string out = absl::StrCat(JsonEscapedEbnf(e.kids[0]), "{", e.min);
      if (e.max != e.min) {
        absl::StrAppend(&out, ",", e.max < 0 ? "" : std::to_string(e.max));
      }
      return out + "}";
    }
  }
  return "\"\"";
}

}  // namespace mmserve::grammar
