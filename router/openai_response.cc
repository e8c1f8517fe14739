// Response bodies, SSE events and errors: the reply half of router/openai.h.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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

json FinishReasonJson(FinishReason reason, bool tool_calls = false) {
  std::string s = OpenAiFinishReason(reason, tool_calls);
  return s.empty() ? json(nullptr) : json(s);
}

// A whole call of a message's tool_calls.
json ToolCallJson(const mmserve::v1::ToolCall& call) {
  json j;
  j["id"] = call.id();
  j["type"] = "function";
  j["function"] = {{"name", call.name()}, {"arguments", call.arguments()}};
  return j;
}

// A delta's entry of delta.tool_calls: the call's first (with id) names it.
json ToolCallDeltaJson(const mmserve::v1::ToolCallDelta& d) {
  json j;
  j["index"] = d.index();
  json function;
  if (!d.id().empty()) {
    j["id"] = d.id();
    j["type"] = "function";
    function["name"] = d.name();
  }
  function["arguments"] = d.arguments();
  j["function"] = std::move(function);
  return j;
}

// A response with tool call deltas as one response per chunk: the text (and
// logprobs) with the first, one delta each, the finish with the last.
std::vector<GenerateResponse> SplitToolCallChunks(const GenerateResponse& response) {
  std::vector<GenerateResponse> parts;
  GenerateResponse head = response;
  head.clear_tool_calls();
  head.clear_finish_reason();
  head.clear_matched_stop();
  head.clear_usage();
  if (!head.text().empty() || head.logprobs_size() > 0) parts.push_back(head);
  for (const mmserve::v1::ToolCallDelta& d : response.tool_calls()) {
    GenerateResponse& part = parts.emplace_back();
    part.set_request_id(response.request_id());
    part.set_index(response.index());
    *part.add_tool_calls() = d;
  }
  GenerateResponse& last = parts.back();
  last.set_finish_reason(response.finish_reason());
  last.set_matched_stop(response.matched_stop());
  if (response.has_usage()) *last.mutable_usage() = response.usage();
  return parts;
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

std::string OpenAiFinishReason(FinishReason reason, bool tool_calls) {
  switch (reason) {
    case mmserve::v1::FINISH_REASON_STOP:
    case mmserve::v1::FINISH_REASON_STOP_STRING:
      return tool_calls ? "tool_calls" : "stop";
    case mmserve::v1::FINISH_REASON_LENGTH:
      return "length";
    case mmserve::v1::FINISH_REASON_ABORT:
      return "abort";
    default:
      return "";
  }
}

void ChoicesUsage::Add(uint32_t index, const Usage& usage) {
  if (index == 0) {
    usage_.set_prompt_tokens(usage.prompt_tokens());
    usage_.set_cached_prompt_tokens(usage.cached_prompt_tokens());
    usage_.set_image_tokens(usage.image_tokens());
    usage_.set_cached_images(usage.cached_images());
  }
  usage_.set_completion_tokens(usage_.completion_tokens() + usage.completion_tokens());
}

CollectedChoices::CollectedChoices(uint32_t n, const std::string& prefix)
    : choices_(std::max<uint32_t>(n, 1)) {
  for (Choice& c : choices_) c.text = prefix;
}

void CollectedChoices::Add(const GenerateResponse& response) {
  if (response.index() >= choices_.size()) return;
  if (request_id_.empty()) request_id_ = response.request_id();
  Choice& c = choices_[response.index()];
  c.text += response.text();
  c.logprobs.MergeFrom(response.logprobs());
  if (response.finish_reason() != mmserve::v1::FINISH_REASON_UNSPECIFIED) {
    c.finish_reason = response.finish_reason();
    c.matched_stop = response.matched_stop();
  }
  if (response.has_usage()) usage_.Add(response.index(), response.usage());
  for (const mmserve::v1::ToolCallDelta& d : response.tool_calls()) {
    if (d.index() >= c.tool_calls.size()) c.tool_calls.resize(d.index() + 1);
    mmserve::v1::ToolCall& call = c.tool_calls[d.index()];
    if (!d.id().empty()) call.set_id(d.id());
    if (!d.name().empty()) call.set_name(d.name());
    call.mutable_arguments()->append(d.arguments());
  }
}

bool CollectedChoices::finished() const {
  return std::all_of(choices_.begin(), choices_.end(), [](const Choice& c) {
    return c.finish_reason != mmserve::v1::FINISH_REASON_UNSPECIFIED;
  });
}

std::string ChatCompletionBuilder::Json() const {
  json choices = json::array();
  for (size_t i = 0; i < choices_.choices().size(); ++i) {
    const CollectedChoices::Choice& c = choices_.choices()[i];
    json choice;
    choice["index"] = i;
    const bool called = !c.tool_calls.empty();
    json message = {{"role", "assistant"}};
    message["content"] = called && c.text.empty() ? json(nullptr) : json(c.text);
    if (called) {
      json calls = json::array();
      for (const mmserve::v1::ToolCall& call : c.tool_calls) calls.push_back(ToolCallJson(call));
      message["tool_calls"] = std::move(calls);
    }
    choice["message"] = std::move(message);
    if (ctx_.logprobs) {
      choice["logprobs"] = LogprobsJson(c.logprobs);
    } else {
      choice["logprobs"] = nullptr;
    }
    choice["finish_reason"] = FinishReasonJson(c.finish_reason, called);
    // vLLM's extension: the stop string that ended the completion.
    choice["stop_reason"] = c.matched_stop.empty() ? json(nullptr) : json(c.matched_stop);
    choices.push_back(std::move(choice));
  }

  json j;
  j["id"] = CompletionId(choices_.request_id());
  j["object"] = "chat.completion";
  j["created"] = ctx_.created;
  j["model"] = ctx_.model;
  j["choices"] = std::move(choices);
  j["usage"] = UsageJson(choices_.usage());
  return Dump(j);
}

std::string ChatCompletionChunkJson(const CompletionContext& ctx, const GenerateResponse& response,
                                    bool first, bool tool_calls) {
  json delta = json::object();
  if (first) delta["role"] = "assistant";
  if (!response.text().empty()) {
    delta["content"] = response.text();
  } else if (first) {
    delta["content"] = ctx.tool_calls ? json(nullptr) : json("");
  }
  if (response.tool_calls_size() > 0) {
    json calls = json::array();
    for (const mmserve::v1::ToolCallDelta& d : response.tool_calls()) {
      calls.push_back(ToolCallDeltaJson(d));
    }
    delta["tool_calls"] = std::move(calls);
  }

  json choice;
  choice["index"] = response.index();
  choice["delta"] = std::move(delta);
  choice["logprobs"] = ctx.logprobs && response.logprobs_size() > 0
                           ? LogprobsJson(response.logprobs())
                           : json(nullptr);
  choice["finish_reason"] = FinishReasonJson(response.finish_reason(), tool_calls);
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
  if (response.tool_calls_size() == 0) return OnPart(response);
  std::string out;
  for (const GenerateResponse& part : SplitToolCallChunks(response)) out += OnPart(part);
  return out;
}

std::string ChatCompletionStream::OnPart(const GenerateResponse& response) {
  const uint32_t i = response.index();
  if (done_ || i >= finished_.size() || finished_[i]) return "";
  bool final = response.finish_reason() != mmserve::v1::FINISH_REASON_UNSPECIFIED;
  bool has_news = final || !response.text().empty() || response.tool_calls_size() > 0 ||
                  (ctx_.logprobs && response.logprobs_size() > 0);
  if (opened_[i] && !has_news) return "";
  if (response.tool_calls_size() > 0) called_[i] = true;
  std::string out = SseEvent(ChatCompletionChunkJson(ctx_, response, !opened_[i], called_[i]));
  opened_[i] = true;
  if (final) {
    finished_[i] = true;
    usage_.Add(i, response.usage());
    if (++num_finished_ == finished_.size()) {
      if (ctx_.include_usage) {
        out += SseEvent(ChatCompletionUsageChunkJson(ctx_, response.request_id(), usage_.usage()));
      }
      out += SseDone();
      done_ = true;
    }
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
