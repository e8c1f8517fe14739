// UTF-8 and Unicode helpers for the tokenizer: code point iteration, the
// character classes the Qwen2 pre-tokenizer regex uses (\p{L}, \p{N}, \s),
// and NFC normalization. Classes come from ICU's Unicode data. Thread-safe.
#ifndef MMSERVE_MODEL_UNICODE_H_
#define MMSERVE_MODEL_UNICODE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace mmserve::model {

// Decodes the code point at s[*pos] and advances *pos past it. Invalid or
// truncated sequences decode as U+FFFD and advance one byte.
char32_t NextCodePoint(absl::string_view s, size_t* pos);

// Appends the UTF-8 encoding of `cp`.
void AppendUtf8(char32_t cp, std::string* out);

// \p{L}: general category L (Lu, Ll, Lt, Lm, Lo).
bool IsLetter(char32_t cp);
// \p{N}: general category N (Nd, Nl, No).
bool IsNumber(char32_t cp);
// \s as the tokenizers' regex engine has it: the Unicode White_Space
// property (tab..CR, space, U+0085, and categories Zs, Zl, Zp).
bool IsWhitespace(char32_t cp);

// Unicode NFC of UTF-8 `s`. Invalid UTF-8 is passed through unchanged.
std::string NormalizeNfc(absl::string_view s);

// Length of the longest prefix of `s` that is complete, valid UTF-8 (an
// incomplete sequence at the end is excluded; an invalid byte ends the prefix
// too).
size_t ValidUtf8Prefix(absl::string_view s);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_UNICODE_H_
