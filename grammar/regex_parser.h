// Regular expressions (the common subset of Python's re and ECMAScript) as
// grammar expressions: literals, escapes (\d \w \s \D \W \S \n \t \xHH
// \uHHHH, escaped punctuation), classes [a-z] [^...], `.` (any code point
// but newline), * + ? {m} {m,} {m,n} (lazy forms match the same strings),
// | ( ) (?: ) and named groups. A leading ^ and trailing $ are accepted;
// the whole output must match either way. Back-references, lookaround,
// word boundaries and inline flags are refused.
#ifndef MMSERVE_GRAMMAR_REGEX_PARSER_H_
#define MMSERVE_GRAMMAR_REGEX_PARSER_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "grammar/ast.h"

namespace mmserve::grammar {

struct ParsedRegex {
  Expr expr;
  bool anchored_start = false;  // began with ^
  bool anchored_end = false;    // ended with $
};

// InvalidArgument "regex: <reason> at <offset>" (offset in bytes).
absl::StatusOr<ParsedRegex> ParseRegex(std::string_view pattern);

// A grammar whose root matches exactly the pattern's strings.
absl::StatusOr<Grammar> RegexGrammar(std::string_view pattern);

}  // namespace mmserve::grammar

#endif  // MMSERVE_GRAMMAR_REGEX_PARSER_H_
