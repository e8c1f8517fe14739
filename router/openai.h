// OpenAI-compatible Chat Completions mapped onto the public proto, the way
// vLLM's server does it. Pure functions and small value classes, no I/O.
//
//   // POST /v1/chat/completions
//   ASSIGN_OR_RETURN(OpenAiChatRequest chat, ParseChatCompletionRequest(body, limits));
//   CompletionContext ctx{chat.model, absl::ToUnixSeconds(absl::Now()),
//                         chat.request.sampling().has_logprobs(), chat.include_usage};
//   if (!chat.stream) {
//     ChatCompletionBuilder reply(ctx);
//     for (const GenerateResponse& r : stream) reply.Add(r);
//     Send(200, "application/json", reply.Json());
//   } else {
//     ChatCompletionStream sse(ctx);  // Content-Type: text/event-stream
//     for (const GenerateResponse& r : stream) Send(sse.OnResponse(r));
//     // on a gRPC error after the first byte: Send(sse.OnError(status));
//   }
//   // on an error before any byte: Send(HttpStatusFor(s.code()), ErrorJson(s));
//
// Fields read from the request: model, messages (role system/user/assistant/
// tool, "developer" as system; content a string or a list of text and image_url
// parts, images as data: URLs with base64 or as http(s) URLs, which are put
// in Image.url for the router to fetch, router/request_fetch.h), stream,
// stream_options.include_usage, temperature, top_p, top_k (-1 = off, as in
// vLLM), min_p, seed, max_tokens / max_completion_tokens (the latter wins),
// stop, stop_token_ids, ignore_eos, min_tokens, logprobs + top_logprobs,
// skip_special_tokens, presence_penalty, frequency_penalty,
// repetition_penalty, logit_bias ({"<token id>": bias}), add_generation_prompt,
// n (GenerateRequest.n), priority (vLLM's extension: lower runs first among
// waiting requests), tools, tool_choice, parallel_tool_calls, an assistant
// message's tool_calls and a "tool" message's tool_call_id (Chat's tool
// fields; router/openai_tools.h), response_format and vLLM's guided_json /
// guided_regex / guided_grammar (SamplingParams.constraint). Fields that
// change nothing at their neutral value (best_of 1, ...) are accepted there
// and refused elsewhere; user, metadata and other
// unknown fields are ignored, as vLLM does. Value ranges (temperature >= 0,
// ...) are left to the router's SamplingParams validation, so both APIs
// refuse the same values with the same reasons; only values the proto cannot
// hold (negative counts, non-integers) are refused here.
//
// Thread-safety: free functions are thread-safe; a builder or stream object
// belongs to one request and is not thread-safe.
#ifndef MMSERVE_ROUTER_OPENAI_H_
#define MMSERVE_ROUTER_OPENAI_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/inference.pb.h"

namespace mmserve::router {

struct OpenAiLimits {
  size_t max_body_bytes = 64 << 20;   // whole JSON body
  size_t max_image_bytes = 20 << 20;  // one decoded image
  int max_images = 16;                // images and videos per request
  size_t max_video_bytes = 64 << 20;  // one decoded video_url
};

struct OpenAiChatRequest {
  mmserve::v1::GenerateRequest request;
  bool stream = false;
  // stream_options.include_usage: send a usage chunk before [DONE].
  bool include_usage = false;
  // The model as the client named it ("" when absent); also in request.model.
  std::string model;
};

// Parses a POST /v1/chat/completions body. Every refusal is
// INVALID_ARGUMENT with a reason naming the field ("messages[1].content[0]:
// ..."). request.stream always asks for usage (the non-streamed reply needs
// it); request_id is left empty for the router to assign.
[[nodiscard]] absl::StatusOr<OpenAiChatRequest> ParseChatCompletionRequest(
    absl::string_view json_body, const OpenAiLimits& limits);

// What a reply needs besides the GenerateResponse stream.
struct CompletionContext {
  // Echoed as "model": the served model's id (the client may have named none).
  std::string model;
  int64_t created = 0;         // unix seconds, echoed as "created"
  bool logprobs = false;       // the request asked for logprobs
  bool include_usage = false;  // streams only: send the usage chunk
  uint32_t n = 1;              // choices (GenerateResponse.index 0..n-1)
  // The output is parsed for tool calls: a first chunk without text says
  // content null (a reply of calls only has none).
  bool tool_calls = false;
};

// The usage of a request's n choices: the prompt's counts once (choice 0's),
// completion tokens summed.
class ChoicesUsage {
 public:
  void Add(uint32_t index, const mmserve::v1::Usage& usage);
  const mmserve::v1::Usage& usage() const { return usage_; }

 private:
  mmserve::v1::Usage usage_;
};

// A request's n choices collected from its GenerateResponse stream, for a
// whole (not streamed) reply: each choice's text (after `prefix`, e.g. an
// echoed prompt), logprobs and finish, the request id and ChoicesUsage.
class CollectedChoices {
 public:
  struct Choice {
    std::string text;
    google::protobuf::RepeatedPtrField<mmserve::v1::PositionLogprobs> logprobs;
    mmserve::v1::FinishReason finish_reason = mmserve::v1::FINISH_REASON_UNSPECIFIED;
    std::string matched_stop;
    // Tool calls assembled from the responses' ToolCallDelta (by index:
    // id and name set, arguments concatenated).
    std::vector<mmserve::v1::ToolCall> tool_calls;
  };
  // max(n, 1) choices.
  explicit CollectedChoices(uint32_t n, const std::string& prefix = "");
  // A response of choice response.index() (< n; others are dropped).
  void Add(const mmserve::v1::GenerateResponse& response);
  // Whether every choice's final response has arrived.
  bool finished() const;
  const std::vector<Choice>& choices() const { return choices_; }
  const std::string& request_id() const { return request_id_; }
  const mmserve::v1::Usage& usage() const { return usage_.usage(); }

 private:
  std::string request_id_;
  std::vector<Choice> choices_;
  ChoicesUsage usage_;
};

// OpenAI's finish_reason for ours: STOP and STOP_STRING -> "stop" (or
// "tool_calls" when the choice made tool calls), LENGTH -> "length", ABORT ->
// "abort" (as vLLM); "" while unfinished.
std::string OpenAiFinishReason(mmserve::v1::FinishReason reason, bool tool_calls = false);

// Collects a whole GenerateResponse stream into one chat.completion body.
class ChatCompletionBuilder {
 public:
  explicit ChatCompletionBuilder(CompletionContext ctx) : ctx_(std::move(ctx)), choices_(ctx_.n) {}

  // A response of choice response.index() (< n; others are dropped).
  void Add(const mmserve::v1::GenerateResponse& response) { choices_.Add(response); }
  // Whether every choice's final response has arrived.
  bool finished() const { return choices_.finished(); }
  // The "chat.completion" object: id "chatcmpl-<request_id>", choices[i]
  // (index i) with message {role, content, tool_calls} (content null when
  // the choice made calls and said nothing else; tool_calls only when it
  // made some: {id, type "function", function {name, arguments}}),
  // finish_reason, logprobs (null unless requested), and usage
  // (ChoicesUsage).
  std::string Json() const;

 private:
  CompletionContext ctx_;
  CollectedChoices choices_;
};

// One "chat.completion.chunk" for one GenerateResponse: choices[0].index
// the response's index, delta.role "assistant" when `first` (the choice's
// first chunk), delta.content the response's text, logprobs when
// requested, finish_reason on the final response (null before), and
// "usage": null when ctx.include_usage (OpenAI's shape: usage comes in its
// own last chunk). The response's tool call deltas go in delta.tool_calls:
// {index, id, type "function", function {name, arguments}} for a call's first
// delta, {index, function {arguments}} for the rest. `tool_calls`: the choice
// has made calls (its finish_reason is then "tool_calls").
std::string ChatCompletionChunkJson(const CompletionContext& ctx,
                                    const mmserve::v1::GenerateResponse& response, bool first,
                                    bool tool_calls = false);
// The usage chunk sent after the final chunk when include_usage: empty
// choices and the usage object.
std::string ChatCompletionUsageChunkJson(const CompletionContext& ctx,
                                         const std::string& request_id,
                                         const mmserve::v1::Usage& usage);

// "data: <json>\n\n".
std::string SseEvent(absl::string_view json);
// "data: [DONE]\n\n", the stream's last event.
std::string SseDone();

// Turns a GenerateResponse stream into SSE events.
class ChatCompletionStream {
 public:
  explicit ChatCompletionStream(CompletionContext ctx)
      : ctx_(std::move(ctx)),
        opened_(std::max<uint32_t>(ctx_.n, 1)),
        finished_(std::max<uint32_t>(ctx_.n, 1)),
        called_(std::max<uint32_t>(ctx_.n, 1)) {}

  // The events for one response (possibly none): each choice's first chunk
  // opens with the role; a response with nothing to say sends nothing; a
  // response with tool call deltas sends its text, then one chunk per
  // delta (as OpenAI does); a final response sends its choice's finish
  // chunk, and the last choice's also the usage chunk (summed,
  // ChoicesUsage) when requested, and [DONE].
  std::string OnResponse(const mmserve::v1::GenerateResponse& response);
  // An error after the stream began (HTTP status already sent): an event
  // holding ErrorJson(status), then [DONE], as vLLM does.
  std::string OnError(const absl::Status& status);
  bool done() const { return done_; }

 private:
  // One chunk's worth of a response (at most one tool call delta).
  std::string OnPart(const mmserve::v1::GenerateResponse& part);

  CompletionContext ctx_;
  std::vector<bool> opened_;    // per choice: its first chunk went out
  std::vector<bool> finished_;  // per choice: its final chunk went out
  std::vector<bool> called_;    // per choice: a tool call went out
  uint32_t num_finished_ = 0;
  ChoicesUsage usage_;
  bool done_ = false;
};

// HTTP status for a Status code: INVALID_ARGUMENT and OUT_OF_RANGE 400, UNAUTHENTICATED 401,
// PERMISSION_DENIED 403, NOT_FOUND 404, RESOURCE_EXHAUSTED 429, CANCELLED
// 499, UNIMPLEMENTED 501, UNAVAILABLE 503, DEADLINE_EXCEEDED 504, OK 200,
// anything else 500.
int HttpStatusFor(absl::StatusCode code);

// OpenAI's string error.code for a Status code: "invalid_api_key" for
// UNAUTHENTICATED, "rate_limit_exceeded" for RESOURCE_EXHAUSTED, else the
// code's name in lower case ("invalid_argument", "unavailable", ...).
std::string ErrorCodeFor(absl::StatusCode code);

// {"error":{"message":..., "type":..., "param":null, "code":"<code>"}}.
// type is OpenAI's "invalid_request_error" for 4xx other than 404 and 429,
// "not_found_error", "rate_limit_error", "server_error" for 5xx and
// "cancelled" for 499. For the HTTP-only refusals (405, 413, 415).
std::string HttpErrorJson(int http_status, absl::string_view code, absl::string_view message);

// HttpErrorJson(HttpStatusFor(code), ErrorCodeFor(code), message).
std::string ErrorJson(const absl::Status& status);

// GET /v1/models: {"object":"list","data":[{"id", "object":"model",
// "created", "owned_by":"mmserve", "max_model_len"}, ...]}.
std::string ModelsJson(const mmserve::v1::ListModelsResponse& models, int64_t created = 0);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_OPENAI_H_
