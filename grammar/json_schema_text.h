// Text helpers of the JSON schema converter: EBNF literals, JSON values as
// compact text, integer ranges, string formats and patterns as EBNF.
#ifndef MMSERVE_GRAMMAR_JSON_SCHEMA_TEXT_H_
#define MMSERVE_GRAMMAR_JSON_SCHEMA_TEXT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "grammar/ast.h"
#include "nlohmann/json.hpp"

namespace mmserve::grammar {

// `bytes` as an EBNF "literal".
std::string EbnfLiteral(std::string_view bytes);

// `value` as JSON text with ", " and ": " separators (Python's json.dumps).
std::string DumpJson(const nlohmann::ordered_json& value);

// Integers in [lo, hi] (either bound may be absent) as an EBNF expression
// without leading zeros; InvalidArgument when the range is empty.
absl::StatusOr<std::string> IntegerRangeEbnf(std::optional<int64_t> lo, std::optional<int64_t> hi);

// The contents (between the quotes) of a JSON string with `format`: date,
// time, date-time (RFC 3339), uuid, email. NotFound for other formats.
absl::StatusOr<std::string> FormatEbnf(std::string_view format);

// A JSON string's contents whose decoded text `expr` matches, every
// character written as JSON requires (quotes, backslashes and control
// characters escaped). `any_char` names the rule for one JSON character.
std::string JsonEscapedEbnf(const Expr& expr);

}  // namespace mmserve::grammar

#endif  // MMSERVE_GRAMMAR_JSON_SCHEMA_TEXT_H_
