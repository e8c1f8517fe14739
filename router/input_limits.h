// Bounds on a request's input that are checked before any work is spent on
// it: the prompt's text bytes against what the context can hold at all, and
// a scan of a JSON body that bounds its text bytes without parsing it.
// Pure functions, thread-safe.
//
//   options.max_prompt_bytes = MaxPromptBytes(MaxTokenBytes(*tokenizer), max_model_len);
//   if (JsonTextBytesLowerBound(body) > options.max_prompt_bytes) -> refuse, unparsed
//   RETURN_IF_ERROR(CheckPromptBytes(options, request));  // in ValidateRequest
//
// The bound: every token stands for at most `max_token_bytes` bytes of
// normalized text, and NFC normalization shrinks UTF-8 text at most 3x
// (a Hangul L+V+T jamo triple, 9 bytes, composes to one 3-byte syllable), so
// a prompt of more than 3 * max_token_bytes * max_model_len bytes has more
// than max_model_len tokens whatever the tokenizer does with it.
#ifndef MMSERVE_ROUTER_INPUT_LIMITS_H_
#define MMSERVE_ROUTER_INPUT_LIMITS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "model/tokenizer.h"
#include "proto/inference.pb.h"
#include "router/request_validation.h"

namespace mmserve::router {

// The most bytes one token of `tokenizer` stands for (vocabulary and added
// tokens).
size_t MaxTokenBytes(const model::Tokenizer& tokenizer);

// Text bytes beyond which no prompt fits `max_model_len` tokens.
size_t MaxPromptBytes(size_t max_token_bytes, int max_model_len);

// The request's text bytes (chat text parts or raw text).
size_t PromptTextBytes(const mmserve::v1::GenerateRequest& request);

// INVALID_ARGUMENT when options.max_prompt_bytes > 0 and the request's text
// is longer: it cannot fit the context, so it is not tokenized.
[[nodiscard]] absl::Status CheckPromptBytes(const RouterOptions& options,
                                            const mmserve::v1::GenerateRequest& request);

// A lower bound on the decoded bytes of the JSON strings in `body` that are
// not data: URLs (images), found with memchr and never more than one pass:
// each escape counts as its shortest decoding (a \uXXXX as 1 byte). Keys and
// other string values count too, so the bound covers the prompt's text plus
// a few short names. Not a validator: malformed JSON gives some number.
size_t JsonTextBytesLowerBound(absl::string_view body);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_INPUT_LIMITS_H_
