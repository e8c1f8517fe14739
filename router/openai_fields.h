// The JSON readers the OpenAI request parsers share (chat completions in
// openai_request.cc, completions in openai_completions.cc): typed field
// access whose refusals are INVALID_ARGUMENT naming the field ("top_k: must
// be an integer"), and the sampling and stopping fields both endpoints take.
// Value ranges are left to the router's SamplingParams validation. Private to
// the :openai library. Thread-safe (pure functions).
#ifndef MMSERVE_ROUTER_OPENAI_FIELDS_H_
#define MMSERVE_ROUTER_OPENAI_FIELDS_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/common.pb.h"
#include "proto/inference.pb.h"

namespace mmserve::router::openai_fields {

using json = nlohmann::json;

inline constexpr int64_t kUint32Max = std::numeric_limits<uint32_t>::max();

// INVALID_ARGUMENT "<field>: <reason>".
absl::Status FieldError(absl::string_view field, absl::string_view reason);

// The value of obj[key], or nullptr when absent or JSON null (clients send
// null for "unset").
const json* Find(const json& obj, const char* key);

absl::StatusOr<bool> GetBool(const json& v, absl::string_view field);
absl::StatusOr<std::string> GetString(const json& v, absl::string_view field);
// A finite number.
absl::StatusOr<double> GetNumber(const json& v, absl::string_view field);
// An integer in [min, max]; integral floats such as 5.0 count as integers
// (pydantic, behind vLLM and the openai package, accepts them too).
absl::StatusOr<int64_t> GetInteger(const json& v, absl::string_view field, int64_t min,
                                   int64_t max);

// The body as a JSON object, at most max_body_bytes.
absl::StatusOr<json> ParseBody(absl::string_view json_body, size_t max_body_bytes);

// "stream" and "stream_options" ({"include_usage": bool}, only with
// "stream": true).
absl::Status ParseStreamFlags(const json& body, bool* stream, bool* include_usage);

// n (GenerateRequest.n; 1..128 here, the router's limit is lower) and
// best_of (1 only).
absl::Status ParseChoices(const json& body, mmserve::v1::GenerateRequest* request);

// temperature, top_p, top_k (-1 = off, as in vLLM), min_p, seed.
absl::Status ParseSamplerParams(const json& body, mmserve::v1::SamplingParams* s);
// presence_penalty, frequency_penalty, repetition_penalty, logit_bias
// ({"<token id>": bias}: keys are decimal strings, OpenAI's shape).
absl::Status ParsePenalties(const json& body, mmserve::v1::SamplingParams* s);
// max_tokens / max_completion_tokens (the latter wins), stop, stop_token_ids,
// ignore_eos, min_tokens, skip_special_tokens.
absl::Status ParseStopping(const json& body, mmserve::v1::SamplingParams* s);

// Structured output (openai_constraint.cc): response_format ({"type":
// "text" | "json_object" | "json_schema"}, OpenAI's shape) or vLLM's
// guided_json, guided_regex, guided_grammar, as SamplingParams.constraint;
// at most one of them. Each is parsed (grammar::Validate), and refused
// naming the field and the reason ("response_format.json_schema.schema:
// ..."). `raw_body` is `body`'s text: a schema keeps its key order.
absl::Status ParseConstraint(const json& body, absl::string_view raw_body,
                             mmserve::v1::SamplingParams* s);

}  // namespace mmserve::router::openai_fields

#endif  // MMSERVE_ROUTER_OPENAI_FIELDS_H_
