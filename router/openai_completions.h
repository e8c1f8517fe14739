// OpenAI's Completions API (POST /v1/completions, the raw-prompt endpoint)
// mapped onto the public proto, as vLLM's server does it. Pure functions and
// small value classes, no I/O; the HTTP front end drives them like the chat
// ones (router/openai.h).
//
//   ASSIGN_OR_RETURN(OpenAiCompletionRequest c, ParseCompletionRequest(body, limits));
//   CompletionContext ctx{model, absl::ToUnixSeconds(absl::Now()),
//                         c.request.sampling().has_logprobs(), c.include_usage};
//   TextCompletionBuilder reply(ctx, c.echo);   // or TextCompletionStream for SSE
//   for (const GenerateResponse& r : stream) reply.Add(r);
//   Send(200, "application/json", reply.Json());
//
// Fields read: model, prompt (a string, or token ids; a list holding one of
// either), echo (text prompts only, without logprobs), stream,
// stream_options.include_usage, max_tokens (default 16, as OpenAI),
// temperature, top_p, seed, stop, presence_penalty, frequency_penalty,
// logit_bias, logprobs (an integer, 0..20), n (GenerateRequest.n), best_of
// (1 only), and
// vLLM's top_k, min_p, repetition_penalty, min_tokens, ignore_eos,
// stop_token_ids, skip_special_tokens and priority. `suffix` is refused (no
// fill-in-the-middle); several prompts in one request are refused; unknown
// fields (user, ...) are ignored.
//
// Thread-safety: free functions are thread-safe; a builder or stream object
// belongs to one request and is not thread-safe.
#ifndef MMSERVE_ROUTER_OPENAI_COMPLETIONS_H_
#define MMSERVE_ROUTER_OPENAI_COMPLETIONS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/inference.pb.h"
#include "router/openai.h"

namespace mmserve::router {

struct OpenAiCompletionRequest {
  // A raw prompt (text or token ids); request_id left for the router.
  mmserve::v1::GenerateRequest request;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string model;           // as the client named it ("" when absent)
  std::string echo;            // echo: the prompt text, put before the completion
};

// Parses a POST /v1/completions body. Every refusal is INVALID_ARGUMENT
// naming the field.
[[nodiscard]] absl::StatusOr<OpenAiCompletionRequest> ParseCompletionRequest(
    absl::string_view json_body, const OpenAiLimits& limits);

// Collects a GenerateResponse stream into one "text_completion" object: id
// "cmpl-<request_id>", choices[i] {index, text (the echo first), logprobs
// (the legacy shape: tokens, token_logprobs, top_logprobs, text_offset; null
// unless requested), finish_reason}, usage (ChoicesUsage).
class TextCompletionBuilder {
 public:
  TextCompletionBuilder(CompletionContext ctx, const std::string& echo)
      : ctx_(std::move(ctx)), echo_size_(echo.size()), choices_(ctx_.n, echo) {}
  // A response of choice response.index() (< n; others are dropped).
  void Add(const mmserve::v1::GenerateResponse& response) { choices_.Add(response); }
  std::string Json() const;

 private:
  CompletionContext ctx_;
  size_t echo_size_;  // text_offset of each choice's first token
  CollectedChoices choices_;
};

// Turns a GenerateResponse stream into "text_completion" SSE events: one
// chunk per response with news (each choice's first carries the echo), then
// once every choice finished the usage chunk when requested, and [DONE].
class TextCompletionStream {
 public:
  TextCompletionStream(CompletionContext ctx, std::string echo);
  std::string OnResponse(const mmserve::v1::GenerateResponse& response);
  // An error after the stream began: its ErrorJson event, then [DONE].
  std::string OnError(const absl::Status& status);
  bool done() const { return done_; }

 private:
  struct Choice {
    bool opened = false;    // its first chunk (with the echo) went out
    bool finished = false;  // its final chunk went out
    size_t offset = 0;      // text_offset of its next token
  };
  CompletionContext ctx_;
  std::string echo_;
  std::vector<Choice> choices_;
  uint32_t num_finished_ = 0;
  ChoicesUsage usage_;
  bool done_ = false;
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_OPENAI_COMPLETIONS_H_
