// Splits text into the pieces Qwen2's tokenizer applies BPE to. Equivalent to
// the "Split" pre-tokenizer of Qwen2's tokenizer.json with behavior
// "Isolated" and the pattern
//
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
//    ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// written out by hand (as llama.cpp does for known patterns): each
// alternative is tried in order at the current position, with the regex
// engine's backtracking reproduced where it matters. Pieces cover the input
// exactly, in order.
//
//   std::vector<absl::string_view> pieces = SplitQwen2("Hello world's 123");
//   // "Hello", " world", "'s", " ", "1", "2", "3"
//
// Thread-safe (pure function).
#ifndef MMSERVE_MODEL_QWEN2_PRETOKENIZER_H_
#define MMSERVE_MODEL_QWEN2_PRETOKENIZER_H_

#include <vector>

#include "absl/strings/string_view.h"

namespace mmserve::model {

// The pattern string as it appears in tokenizer.json, for validation.
extern const char kQwen2SplitPattern[];

// Appends the pieces of `text` (views into it) to `out`.
void SplitQwen2(absl::string_view text, std::vector<absl::string_view>* out);

inline std::vector<absl::string_view> SplitQwen2(absl::string_view text) {
  std::vector<absl::string_view> out;
  SplitQwen2(text, &out);
  return out;
}

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_QWEN2_PRETOKENIZER_H_
