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
      for (const auto& c : m.tool_calls()) bytes += c.name().size() + c.arguments().size();
    }
    // Tools are rendered into the system turn.
    for (const auto& t : request.chat().tools()) {
      bytes += t.function().name().size() + t.function().description().size() +
               t.function().parameters().size();
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

namespace {
constexpr absl::string_view kDataUrl = "data:";
}  // namespace

void JsonTextScanner::Count(const char* from, const char* to) {
  raw_ += static_cast<size_t>(to - from);
  if (prefix_.size() < kDataUrl.size()) {
    prefix_.append(from, std::min<size_t>(kDataUrl.size() - prefix_.size(), to - from));
  }
}

bool JsonTextScanner::OpenIsText() const {
  return prefix_.size() == kDataUrl.size() && prefix_ != kDataUrl;
}

void JsonTextScanner::Close() {
  if (!absl::StartsWith(prefix_, kDataUrl)) total_ += raw_ > 5 * escapes_ ? raw_ - 5 * escapes_ : 0;
  in_string_ = false;
}

void JsonTextScanner::Add(absl::string_view chunk) {
  const char* p = chunk.data();
  const char* const end = chunk.data() + chunk.size();
  while (p < end) {
    if (!in_string_) {
      const char* open = static_cast<const char*>(std::memchr(p, '"', end - p));
      if (open == nullptr) return;
      in_string_ = true;
      raw_ = escapes_ = 0;
      prefix_.clear();
      p = open + 1;
      continue;
    }
    if (escape_pending_) {  // the escaped character, possibly a quote
      escape_pending_ = false;
      Count(p, p + 1);
      ++p;
      continue;
    }
    const char* quote = static_cast<const char*>(std::memchr(p, '"', end - p));
    const char* limit = quote != nullptr ? quote : end;
    const char* slash = static_cast<const char*>(std::memchr(p, '\\', limit - p));
    if (slash != nullptr) {
      Count(p, slash + 1);
      ++escapes_;
      escape_pending_ = true;
      p = slash + 1;
      continue;
    }
    Count(p, limit);
    if (quote == nullptr) return;
    Close();
    p = quote + 1;
  }
}

size_t JsonTextScanner::lower_bound() const {
  if (!in_string_ || !OpenIsText()) return total_;
  return total_ + (raw_ > 5 * escapes_ ? raw_ - 5 * escapes_ : 0);
}

size_t JsonTextBytesLowerBound(absl::string_view body) {
  JsonTextScanner scanner;
  scanner.Add(body);
  return scanner.lower_bound();
}

}  // namespace mmserve::router
