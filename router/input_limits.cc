#include "router/input_limits.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace mmserve::router {

size_t MaxTokenBytes(const model::Tokenizer& tokenizer) {
  size_t longest = 1;
  std::string bytes;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    bytes.clear();
    if (tokenizer.AppendTokenBytes(id, &bytes)) longest = std::max(longest, bytes.size());
  }
  for (const model::AddedToken& t : tokenizer.added_tokens()) {
    longest = std::max(longest, t.content.size());
  }
  return longest;
}

size_t MaxPromptBytes(size_t max_token_bytes, int max_model_len) {
  return 3 * max_token_bytes * static_cast<size_t>(std::max(max_model_len, 1));
}

size_t PromptTextBytes(const mmserve::v1::GenerateRequest& request) {
  size_t bytes = 0;
  if (request.has_chat()) {
    for (const auto& m : request.chat().messages()) {
      for (const auto& p : m.content()) bytes += p.text().size();
    }
  } else if (request.has_raw()) {
    bytes = request.raw().text().size();
  }
  return bytes;
}

absl::Status CheckPromptBytes(const RouterOptions& options,
                              const mmserve::v1::GenerateRequest& request) {
  if (options.max_prompt_bytes == 0) return absl::OkStatus();
  const size_t bytes = PromptTextBytes(request);
  if (bytes <= options.max_prompt_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the prompt's text has ", bytes, " bytes; no prompt over ", options.max_prompt_bytes,
      " bytes fits the ", options.max_model_len, "-token context"));
}

size_t JsonTextBytesLowerBound(absl::string_view body) {
  const char* p = body.data();
  const char* const end = body.data() + body.size();
  size_t total = 0;
  while (p < end) {
    const char* open = static_cast<const char*>(std::memchr(p, '"', end - p));
    if (open == nullptr) break;
    const char* s = open + 1;
    const char* cur = s;
    size_t escapes = 0;
    const char* close = nullptr;
    while (cur < end) {
      const char* quote = static_cast<const char*>(std::memchr(cur, '"', end - cur));
      const char* limit = quote != nullptr ? quote : end;
      const char* slash = static_cast<const char*>(std::memchr(cur, '\\', limit - cur));
      if (slash == nullptr) {
        close = quote;
        break;
      }
      ++escapes;
      cur = slash + 2;  // the escaped character, possibly a quote
    }
    if (close == nullptr) close = end;
    const size_t raw = static_cast<size_t>(close - s);
    if (!absl::StartsWith(absl::string_view(s, raw), "data:")) {
      total += raw > 5 * escapes ? raw - 5 * escapes : 0;
    }
    p = close + 1;
  }
  return total;
}

}  // namespace mmserve::router
