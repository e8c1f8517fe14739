// The EBNF dialect of llama.cpp's GBNF and xgrammar:
//   name ::= alternatives        # a comment
// with "literals" (escapes \n \r \t \" \\ \xHH \uHHHH), character classes
// over code points ([a-z0-9_], [^"\\]), `.` (any code point), grouping
// ( ), postfix * + ? {m} {m,} {m,n}, and `|`. Text is matched as UTF-8.
#ifndef MMSERVE_GRAMMAR_EBNF_PARSER_H_
#define MMSERVE_GRAMMAR_EBNF_PARSER_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "grammar/ast.h"

namespace mmserve::grammar {

// InvalidArgument ("ebnf: expected \"::=\" after rule name at 3:7", ...)
// for text that does not parse, an undefined rule or no rule `root_rule`.
absl::StatusOr<Grammar> ParseEbnf(std::string_view text, std::string_view root_rule = "root");

// Largest repetition bound accepted in {m,n}.
inline constexpr int kMaxRepeat = 10000;

}  // namespace mmserve::grammar

#endif  // MMSERVE_GRAMMAR_EBNF_PARSER_H_
