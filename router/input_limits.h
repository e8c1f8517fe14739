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
#include <string>

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

// The request's text bytes (chat text parts, tool calls and tools, or raw
// text).
size_t PromptTextBytes(const mmserve::v1::GenerateRequest& request);

// INVALID_ARGUMENT when options.max_prompt_bytes > 0 and the request's text
// is longer: it cannot fit the context, so it is not tokenized.
[[nodiscard]] absl::Status CheckPromptBytes(const RouterOptions& options,
                                            const mmserve::v1::GenerateRequest& request);

// A lower bound on the decoded bytes of the JSON strings in a body that are
// not data: URLs (images), fed chunk by chunk as the body arrives, so that a
// body can be refused before it is all read. One memchr pass; each escape
// counts as its shortest decoding (a \uXXXX as 1 byte). Keys and other
// string values count too, so the bound covers the prompt's text plus a few
// short names. Not a validator: malformed JSON gives some number. Not
// thread-safe.
class JsonTextScanner {
 public:
  void Add(absl::string_view chunk);
  // Closed strings, plus the open one once its first 5 bytes show it is not
  // a data: URL.
  size_t lower_bound() const;

 private:
  void Count(const char* from, const char* to);
  bool OpenIsText() const;
  void Close();

  bool in_string_ = false;
  bool escape_pending_ = false;  // the last chunk ended inside an escape
  std::string prefix_;           // the open string's first bytes (<= 5)
  size_t raw_ = 0;               // the open string's bytes so far
  size_t escapes_ = 0;           // and its escapes
  size_t total_ = 0;             // closed strings' bound
};

// JsonTextScanner over a whole body.
size_t JsonTextBytesLowerBound(absl::string_view body);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_INPUT_LIMITS_H_
