// Response bodies, SSE events and errors: the reply half of router/openai.h.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "router/openai.h"

namespace mmserve::router {
namespace {

// Keys in the order OpenAI documents them, not sorted.
using json = nlohmann::ordered_json;
using mmserve::v1::FinishReason;
using mmserve::v1::GenerateResponse;
using mmserve::v1::PositionLogprobs;
using mmserve::v1::TokenLogprob;
using mmserve::v1::Usage;

// Token texts should be valid UTF-8, but a bad byte must not throw out of a
// reply: replace it with U+FFFD.
std::string Dump(const json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
}

std::string CompletionId(const std::string& request_id) {
  return absl::StrCat("chatcmpl-", request_id);
}

json FinishReasonJson(FinishReason reason) {
  std::string s = OpenAiFinishReason(reason);
  return s.empty() ? json(nullptr) : json(s);
}

// OpenAI's token entry: token text, logprob, UTF-8 bytes.
json TokenJson(const TokenLogprob& t) {
  json j;
  j["token"] = t.text();
  // JSON has no -inf; OpenAI-compatible servers report -9999.0 instead.
  j["logprob"] = std::max(static_cast<double>(t.logprob()), -9999.0);
  json bytes = json::array();
  for (unsigned char c : t.text()) bytes.push_back(static_cast<int>(c));
  j["bytes"] = std::move(bytes);
  return j;
}

// {"content": [ {token, logprob, bytes, top_logprobs: [...]}, ... ]}
json LogprobsJson(const google::protobuf::RepeatedPtrField<PositionLogprobs>& positions) {
  json content = json::array();
  for (const PositionLogprobs& p : positions) {
    json entry = TokenJson(p.sampled());
    json top = json::array();
    for (const TokenLogprob& t : p.top()) top.push_back(TokenJson(t));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  json j;
  j["content"] = std::move(content);
  return j;
}

json UsageJson(const Usage& usage) {
  json j;
  j["prompt_tokens"] = usage.prompt_tokens();
  j["completion_tokens"] = usage.completion_tokens();
  j["total_tokens"] = uint64_t{usage.prompt_tokens()} + usage.completion_tokens();
  j["prompt_tokens_details"] = {{"cached_tokens", usage.cached_prompt_tokens()}};
  return j;
}

json ChunkHeader(const CompletionContext& ctx, const std::string& request_id) {
  json j;
  j["id"] = CompletionId(request_id);
  j["object"] = "chat.completion.chunk";
  j["created"] = ctx.created;
  j["model"] = ctx.model;
  return j;
}

}  // namespace

std::string OpenAiFinishReason(FinishReason reason) {
  switch (reason) {
    case mmserve::v1::FINISH_REASON_STOP:
    case mmserve::v1::FINISH_REASON_STOP_STRING:
      return "stop";
    case mmserve::v1::FINISH_REASON_LENGTH:
      return "length";
    case mmserve::v1::FINISH_REASON_ABORT:
      return "abort";
    default:
      return "";
  }
}

void ChatCompletionBuilder::Add(const GenerateResponse& response) {
  if (request_id_.empty()) request_id_ = response.request_id();
  text_ += response.text();
  logprobs_.MergeFrom(response.logprobs());
  if (response.finish_reason() != mmserve::v1::FINISH_REASON_UNSPECIFIED) {
    finish_reason_ = response.finish_reason();
    matched_stop_ = response.matched_stop();
  }
  if (response.has_usage()) usage_ = response.usage();
}

std::string ChatCompletionBuilder::Json() const {
  json choice;
  choice["index"] = 0;
  choice["message"] = {{"role", "assistant"}, {"content", text_}};
  if (ctx_.logprobs) {
    choice["logprobs"] = LogprobsJson(logprobs_);
  } else {
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = FinishReasonJson(finish_reason_);
  // vLLM's extension: the stop string that ended the completion.
  choice["stop_reason"] = matched_stop_.empty() ? json(nullptr) : json(matched_stop_);

  json j;
  j["id"] = CompletionId(request_id_);
  j["object"] = "chat.completion";
  j["created"] = ctx_.created;
  j["model"] = ctx_.model;
  j["choices"] = json::array({std::move(choice)});
  j["usage"] = UsageJson(usage_);
  return Dump(j);
}

std::string ChatCompletionChunkJson(const CompletionContext& ctx, const GenerateResponse& response,
                                    bool first) {
  json delta = json::object();
  if (first) delta["role"] = "assistant";
  if (first || !response.text().empty()) delta["content"] = response.text();

  json choice;
  choice["index"] = 0;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = ctx.logprobs && response.logprobs_size() > 0
                           ? LogprobsJson(response.logprobs())
                           : json(nullptr);
  choice["finish_reason"] = FinishReasonJson(response.finish_reason());
  if (response.finish_reason() != mmserve::v1::FINISH_REASON_UNSPECIFIED) {
    choice["stop_reason"] =
        response.matched_stop().empty() ? json(nullptr) : json(response.matched_stop());
  }

  json j = ChunkHeader(ctx, response.request_id());
  j["choices"] = json::array({std::move(choice)});
  if (ctx.include_usage) j["usage"] = nullptr;
  return Dump(j);
}

std::string ChatCompletionUsageChunkJson(const CompletionContext& ctx,
                                         const std::string& request_id, const Usage& usage) {
  json j = ChunkHeader(ctx, request_id);
  j["choices"] = json::array();
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string SseEvent(absl::string_view json_text) {
  return absl::StrCat("data: ", json_text, "\n\n");
}

std::string SseDone() { return "data: [DONE]\n\n"; }

std::string ChatCompletionStream::OnResponse(const GenerateResponse& response) {
  if (done_) return "";
  bool final = response.finish_reason() != mmserve::v1::FINISH_REASON_UNSPECIFIED;
  bool has_news =
      final || !response.text().empty() || (ctx_.logprobs && response.logprobs_size() > 0);
  if (!first_ && !has_news) return "";
  std::string out = SseEvent(ChatCompletionChunkJson(ctx_, response, first_));
  first_ = false;
  if (final) {
    if (ctx_.include_usage) {
      out += SseEvent(ChatCompletionUsageChunkJson(ctx_, response.request_id(), response.usage()));
    }
    out += SseDone();
    done_ = true;
  }
  return out;
}

std::string ChatCompletionStream::OnError(const absl::Status& status) {
  if (done_) return "";
  done_ = true;
  return SseEvent(ErrorJson(status)) + SseDone();
}

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

std::string ErrorCodeFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kUnauthenticated:
      return "invalid_api_key";
    case absl::StatusCode::kResourceExhausted:
      return "rate_limit_exceeded";
    default:
      return absl::AsciiStrToLower(absl::StatusCodeToString(code));
  }
}

std::string HttpErrorJson(int http_status, absl::string_view code, absl::string_view message) {
  const char* type = http_status == 404   ? "not_found_error"
                     : http_status == 429 ? "rate_limit_error"
                     : http_status == 499 ? "cancelled"
                     : http_status < 500  ? "invalid_request_error"
                                          : "server_error";
  json error;
  error["message"] = std::string(message);
  error["type"] = type;
  error["param"] = nullptr;
  error["code"] = std::string(code);
  json j;
  j["error"] = std::move(error);
  return Dump(j);
}

std::string ErrorJson(const absl::Status& status) {
  return HttpErrorJson(HttpStatusFor(status.code()), ErrorCodeFor(status.code()), status.message());
}

std::string ModelsJson(const mmserve::v1::ListModelsResponse& models, int64_t created) {
  json data = json::array();
  for (const mmserve::v1::ModelCard& card : models.models()) {
    json m;
    m["id"] = card.id();
    m["object"] = "model";
    m["created"] = created;
    m["owned_by"] = "mmserve";
    m["root"] = card.id();
    m["max_model_len"] = card.max_model_len();
    data.push_back(std::move(m));
  }
  json j;
  j["object"] = "list";
  j["data"] = std::move(data);
  return Dump(j);
}

}  // namespace mmserve::router
