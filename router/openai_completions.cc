// ParseCompletionRequest, TextCompletionBuilder and TextCompletionStream
// (router/openai_completions.h).
#include "router/openai_completions.h"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "router/openai_fields.h"

namespace mmserve::router {
namespace {

using mmserve::v1::GenerateResponse;
using mmserve::v1::PositionLogprobs;
using mmserve::v1::SamplingParams;
using openai_fields::FieldError;
using openai_fields::Find;
using openai_fields::GetBool;
using openai_fields::GetInteger;
using openai_fields::GetString;
using openai_fields::json;
using openai_fields::kUint32Max;
using out_json = nlohmann::ordered_json;  // keys in OpenAI's order

// OpenAI's default for this endpoint (chat's is the context).
constexpr uint32_t kDefaultMaxTokens = 16;

// The prompt: a string, token ids, or a list holding exactly one of either.
absl::Status ParsePrompt(const json& body, mmserve::v1::RawPrompt* raw) {
  const json* prompt = Find(body, "prompt");
  if (prompt == nullptr) return FieldError("prompt", "missing");
  const json* one = prompt;
  if (prompt->is_array() && !prompt->empty() &&
      ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    if (prompt->size() != 1) {
      return FieldError("prompt",
                        absl::StrCat("one prompt per request is supported, got ", prompt->size()));
    }
    one = &(*prompt)[0];
  }
  if (one->is_string()) {
    if (one->get_ref<const std::string&>().empty()) return FieldError("prompt", "is empty");
    raw->set_text(one->get<std::string>());
    return absl::OkStatus();
  }
  if (!one->is_array()) {
    return FieldError("prompt", "must be a string or a list of token ids");
  }
  if (one->empty()) return FieldError("prompt", "is empty");
  for (size_t i = 0; i < one->size(); ++i) {
    ASSIGN_OR_RETURN(int64_t id,
                     GetInteger((*one)[i], absl::StrCat("prompt[", i, "]"), 0, kUint32Max));
    raw->add_token_ids(static_cast<uint32_t>(id));
  }
  return absl::OkStatus();
}

// Fields this endpoint refuses or takes at one value only.
absl::Status CheckUnsupported(const json& body) {
  if (const json* v = Find(body, "suffix")) {
    ASSIGN_OR_RETURN(std::string suffix, GetString(*v, "suffix"));
    if (!suffix.empty()) {
      return FieldError("suffix", "is not supported (no fill-in-the-middle); leave it out");
    }
  }
  if (const json* v = Find(body, "use_beam_search")) {
    ASSIGN_OR_RETURN(bool on, GetBool(*v, "use_beam_search"));
    if (on) return FieldError("use_beam_search", "is not supported");
  }
  return absl::OkStatus();
}

// logprobs: an integer k (the sampled token's log probability and the top
// k), not chat's boolean.
absl::Status ParseLogprobs(const json& body, SamplingParams* s) {
  const json* v = Find(body, "logprobs");
  if (v == nullptr) return absl::OkStatus();
  if (v->is_boolean()) {
    return FieldError("logprobs", "must be an integer (the number of alternatives, 0..20)");
  }
  ASSIGN_OR_RETURN(int64_t k, GetInteger(*v, "logprobs", 0, kUint32Max));
  s->set_logprobs(static_cast<uint32_t>(k));
  return absl::OkStatus();
}

std::string Dump(const out_json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, out_json::error_handler_t::replace);
}

// JSON has no -inf; OpenAI-compatible servers report -9999.0 instead.
double Finite(float logprob) { return std::max(static_cast<double>(logprob), -9999.0); }

// The legacy logprobs object for `positions`, the first token at text
// offset *offset, which moves past their texts.
out_json LogprobsJson(const google::protobuf::RepeatedPtrField<PositionLogprobs>& positions,
                      size_t* offset) {
  out_json j;
  out_json tokens = out_json::array(), token_logprobs = out_json::array(),
           top_logprobs = out_json::array(), text_offset = out_json::array();
  for (const PositionLogprobs& p : positions) {
    tokens.push_back(p.sampled().text());
    token_logprobs.push_back(Finite(p.sampled().logprob()));
    out_json top = out_json::object();
    for (const mmserve::v1::TokenLogprob& t : p.top()) {
      if (!top.contains(t.text())) top[t.text()] = Finite(t.logprob());
    }
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(*offset);
    *offset += p.sampled().text().size();
  }
  j["text_offset"] = std::move(text_offset);
  j["token_logprobs"] = std::move(token_logprobs);
  j["tokens"] = std::move(tokens);
  j["top_logprobs"] = std::move(top_logprobs);
  return j;
}

out_json UsageJson(const mmserve::v1::Usage& usage) {
  out_json j;
  j["prompt_tokens"] = usage.prompt_tokens();
  j["completion_tokens"] = usage.completion_tokens();
  j["total_tokens"] = uint64_t{usage.prompt_tokens()} + usage.completion_tokens();
  j["prompt_tokens_details"] = {{"cached_tokens", usage.cached_prompt_tokens()}};
  return j;
}

out_json Header(const CompletionContext& ctx, const std::string& request_id) {
  out_json j;
  j["id"] = absl::StrCat("cmpl-", request_id);
  j["object"] = "text_completion";
  j["created"] = ctx.created;
  j["model"] = ctx.model;
  return j;
}

out_json FinishReasonJson(mmserve::v1::FinishReason reason) {
  const std::string s = OpenAiFinishReason(reason);
  return s.empty() ? out_json(nullptr) : out_json(s);
}

out_json StopReasonJson(const std::string& matched_stop) {
  return matched_stop.empty() ? out_json(nullptr) : out_json(matched_stop);
}

}  // namespace

absl::StatusOr<OpenAiCompletionRequest> ParseCompletionRequest(absl::string_view json_body,
                                                               const OpenAiLimits& limits) {
  ASSIGN_OR_RETURN(json body, openai_fields::ParseBody(json_body, limits.max_body_bytes));
  OpenAiCompletionRequest out;
  mmserve::v1::GenerateRequest& request = out.request;
  if (const json* v = Find(body, "model")) {
    ASSIGN_OR_RETURN(out.model, GetString(*v, "model"));
    request.set_model(out.model);
  }
  RETURN_IF_ERROR(openai_fields::ParseStreamFlags(body, &out.stream, &out.include_usage));
  request.mutable_stream()->set_include_usage(true);
  RETURN_IF_ERROR(CheckUnsupported(body));
  RETURN_IF_ERROR(openai_fields::ParseChoices(body, &request));
  RETURN_IF_ERROR(ParsePrompt(body, request.mutable_raw()));
  SamplingParams* s = request.mutable_sampling();
  RETURN_IF_ERROR(openai_fields::ParseSamplerParams(body, s));
  RETURN_IF_ERROR(openai_fields::ParsePenalties(body, s));
  RETURN_IF_ERROR(openai_fields::ParseStopping(body, s));
  if (!s->has_max_tokens()) s->set_max_tokens(kDefaultMaxTokens);
  RETURN_IF_ERROR(ParseLogprobs(body, s));
  RETURN_IF_ERROR(openai_fields::ParseConstraint(body, json_body, s));
  // vLLM's extension: lower runs first among waiting requests.
  if (const json* v = Find(body, "priority")) {
    ASSIGN_OR_RETURN(int64_t priority, GetInteger(*v, "priority", INT32_MIN, INT32_MAX));
    request.set_priority(static_cast<int32_t>(priority));
  }
  if (const json* v = Find(body, "echo")) {
    ASSIGN_OR_RETURN(bool echo, GetBool(*v, "echo"));
    if (echo) {
      if (request.raw().text().empty()) {
        return FieldError("echo", "needs a text prompt (token-id prompts are not echoed)");
      }
      if (s->has_logprobs()) {
        return FieldError("echo",
                          "with logprobs (the prompt's log probabilities) is not supported");
      }
      out.echo = request.raw().text();
    }
  }
  return out;
}

std::string TextCompletionBuilder::Json() const {
  out_json choices = out_json::array();
  for (size_t i = 0; i < choices_.choices().size(); ++i) {
    const CollectedChoices::Choice& c = choices_.choices()[i];
    out_json choice;
    choice["index"] = i;
    choice["text"] = c.text;
    size_t offset = echo_size_;
    choice["logprobs"] = ctx_.logprobs ? LogprobsJson(c.logprobs, &offset) : out_json(nullptr);
    choice["finish_reason"] = FinishReasonJson(c.finish_reason);
    choice["stop_reason"] = StopReasonJson(c.matched_stop);  // vLLM's extension
    choices.push_back(std::move(choice));
  }
  out_json j = Header(ctx_, choices_.request_id());
  j["choices"] = std::move(choices);
  j["usage"] = UsageJson(choices_.usage());
  return Dump(j);
}

TextCompletionStream::TextCompletionStream(CompletionContext ctx, std::string echo)
    : ctx_(std::move(ctx)), echo_(std::move(echo)), choices_(std::max<uint32_t>(ctx_.n, 1)) {
  for (Choice& c : choices_) c.offset = echo_.size();
}

std::string TextCompletionStream::OnResponse(const GenerateResponse& response) {
  const uint32_t i = response.index();
  if (done_ || i >= choices_.size() || choices_[i].finished) return "";
  Choice& c = choices_[i];
  const bool final = response.finish_reason() != mmserve::v1::FINISH_REASON_UNSPECIFIED;
  const bool logprobs = ctx_.logprobs && response.logprobs_size() > 0;
  const std::string text = c.opened ? response.text() : echo_ + response.text();
  if (!final && text.empty() && !logprobs) return "";
  c.opened = true;
  out_json choice;
  choice["index"] = i;
  choice["text"] = text;
  choice["logprobs"] = logprobs ? LogprobsJson(response.logprobs(), &c.offset) : out_json(nullptr);
  choice["finish_reason"] = FinishReasonJson(response.finish_reason());
  if (final) choice["stop_reason"] = StopReasonJson(response.matched_stop());
  out_json chunk = Header(ctx_, response.request_id());
  chunk["choices"] = out_json::array({std::move(choice)});
  if (ctx_.include_usage) chunk["usage"] = nullptr;
  std::string out = SseEvent(Dump(chunk));
  if (final) {
    c.finished = true;
    usage_.Add(i, response.usage());
    if (++num_finished_ == choices_.size()) {
      if (ctx_.include_usage) {
        out_json usage = Header(ctx_, response.request_id());
        usage["choices"] = out_json::array();
        usage["usage"] = UsageJson(usage_.usage());
        out += SseEvent(Dump(usage));
      }
      out += SseDone();
      done_ = true;
    }
  }
  return out;
}

std::string TextCompletionStream::OnError(const absl::Status& status) {
  if (done_) return "";
  done_ = true;
  return SseEvent(ErrorJson(status)) + SseDone();
}

}  // namespace mmserve::router
