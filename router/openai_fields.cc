// The JSON field readers of router/openai_fields.h.
#include "router/openai_fields.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mmserve::router::openai_fields {

using mmserve::v1::SamplingParams;

absl::Status FieldError(absl::string_view field, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", reason));
}

const json* Find(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<bool> GetBool(const json& v, absl::string_view field) {
  if (!v.is_boolean()) return FieldError(field, "must be a boolean");
  return v.get<bool>();
}

absl::StatusOr<std::string> GetString(const json& v, absl::string_view field) {
  if (!v.is_string()) return FieldError(field, "must be a string");
  return v.get<std::string>();
}

absl::StatusOr<double> GetNumber(const json& v, absl::string_view field) {
  if (!v.is_number()) return FieldError(field, "must be a number");
  double d = v.get<double>();
  if (!std::isfinite(d)) return FieldError(field, "must be finite");
  return d;
}

absl::StatusOr<int64_t> GetInteger(const json& v, absl::string_view field, int64_t min,
                                   int64_t max) {
  int64_t value;
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(max)) {
      return FieldError(field, absl::StrCat("must be at most ", max));
    }
    value = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    value = v.get<int64_t>();
  } else if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || std::trunc(d) != d) return FieldError(field, "must be an integer");
    if (d < -9.2e18 || d > 9.2e18) return FieldError(field, "is out of range");
    value = static_cast<int64_t>(d);
  } else {
    return FieldError(field, "must be an integer");
  }
  if (value < min) return FieldError(field, absl::StrCat("must be at least ", min));
  if (value > max) return FieldError(field, absl::StrCat("must be at most ", max));
  return value;
}

absl::Status ParseSamplerParams(const json& body, SamplingParams* s) {
  if (const json* v = Find(body, "temperature")) {
    ASSIGN_OR_RETURN(double d, GetNumber(*v, "temperature"));
    s->set_temperature(static_cast<float>(d));
  }
  if (const json* v = Find(body, "top_p")) {
    ASSIGN_OR_RETURN(double d, GetNumber(*v, "top_p"));
    s->set_top_p(static_cast<float>(d));
  }
  if (const json* v = Find(body, "top_k")) {
    ASSIGN_OR_RETURN(int64_t k, GetInteger(*v, "top_k", std::numeric_limits<int32_t>::min(),
                                           std::numeric_limits<int32_t>::max()));
    if (k != -1) s->set_top_k(static_cast<int32_t>(k));  // vLLM's -1 means off
  }
  if (const json* v = Find(body, "min_p")) {
    ASSIGN_OR_RETURN(double d, GetNumber(*v, "min_p"));
    s->set_min_p(static_cast<float>(d));
  }
  if (const json* v = Find(body, "seed")) {
    if (v->is_number_integer() && !v->is_number_unsigned() && v->get<int64_t>() < 0) {
      return FieldError("seed", "must be a non-negative integer");
    }
    if (v->is_number_unsigned()) {
      s->set_seed(v->get<uint64_t>());
    } else {
      ASSIGN_OR_RETURN(int64_t seed, GetInteger(*v, "seed", 0, INT64_MAX));
      s->set_seed(static_cast<uint64_t>(seed));
    }
  }
  return absl::OkStatus();
}

absl::Status ParsePenalties(const json& body, SamplingParams* s) {
  using Setter = void (SamplingParams::*)(float);
  for (const auto& [key, set] :
       {std::pair<const char*, Setter>{"presence_penalty", &SamplingParams::set_presence_penalty},
        {"frequency_penalty", &SamplingParams::set_frequency_penalty},
        {"repetition_penalty", &SamplingParams::set_repetition_penalty}}) {
    if (const json* v = Find(body, key)) {
      ASSIGN_OR_RETURN(double d, GetNumber(*v, key));
      (s->*set)(static_cast<float>(d));
    }
  }
  if (const json* v = Find(body, "logit_bias")) {
    if (!v->is_object()) {
      return FieldError("logit_bias", "must be an object of token ids (as strings) to biases");
    }
    for (const auto& [key, value] : v->items()) {
      const std::string field = absl::StrCat("logit_bias[\"", key, "\"]");
      uint32_t token = 0;
      if (key.empty() || key.size() > 10 ||
          key.find_first_not_of("0123456789") != std::string::npos ||
          !absl::SimpleAtoi(key, &token)) {
        return FieldError(field, "the key must be a token id (a non-negative integer)");
      }
      ASSIGN_OR_RETURN(double bias, GetNumber(value, field));
      mmserve::v1::LogitBias* entry = s->add_logit_bias();
      entry->set_token_id(token);
      entry->set_bias(static_cast<float>(bias));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseStopping(const json& body, SamplingParams* s) {
  // max_completion_tokens is OpenAI's current name and wins over the
  // deprecated max_tokens, as in vLLM.
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (const json* v = Find(body, key)) {
      ASSIGN_OR_RETURN(int64_t n, GetInteger(*v, key, 0, kUint32Max));
      s->set_max_tokens(static_cast<uint32_t>(n));
    }
  }
  if (const json* v = Find(body, "stop")) {
    if (v->is_string()) {
      s->add_stop(v->get<std::string>());
    } else if (v->is_array()) {
      for (size_t i = 0; i < v->size(); ++i) {
        ASSIGN_OR_RETURN(std::string stop, GetString((*v)[i], absl::StrCat("stop[", i, "]")));
        s->add_stop(std::move(stop));
      }
    } else {
      return FieldError("stop", "must be a string or a list of strings");
    }
  }
  if (const json* v = Find(body, "stop_token_ids")) {
    if (!v->is_array()) return FieldError("stop_token_ids", "must be a list of integers");
    for (size_t i = 0; i < v->size(); ++i) {
      ASSIGN_OR_RETURN(int64_t id,
                       GetInteger((*v)[i], absl::StrCat("stop_token_ids[", i, "]"), 0, kUint32Max));
      s->add_stop_token_ids(static_cast<uint32_t>(id));
    }
  }
  if (const json* v = Find(body, "ignore_eos")) {
    ASSIGN_OR_RETURN(bool b, GetBool(*v, "ignore_eos"));
    s->set_ignore_eos(b);
  }
  if (const json* v = Find(body, "min_tokens")) {
    ASSIGN_OR_RETURN(int64_t n, GetInteger(*v, "min_tokens", 0, kUint32Max));
    s->set_min_tokens(static_cast<uint32_t>(n));
  }
  if (const json* v = Find(body, "skip_special_tokens")) {
    ASSIGN_OR_RETURN(bool b, GetBool(*v, "skip_special_tokens"));
    s->set_skip_special_tokens(b);
  }
  return absl::OkStatus();
}

absl::Status ParseChoices(const json& body, mmserve::v1::GenerateRequest* request) {
  if (const json* v = Find(body, "n")) {
    ASSIGN_OR_RETURN(int64_t n, GetInteger(*v, "n", 1, 128));
    if (n > 1) request->set_n(static_cast<uint32_t>(n));
  }
  if (const json* v = Find(body, "best_of")) {
    ASSIGN_OR_RETURN(int64_t best_of, GetInteger(*v, "best_of", 1, 128));
    if (best_of != 1)
      return FieldError("best_of", "only 1 is supported (use n for several choices)");
  }
  return absl::OkStatus();
}

absl::Status ParseStreamFlags(const json& body, bool* stream, bool* include_usage) {
  if (const json* v = Find(body, "stream")) {
    ASSIGN_OR_RETURN(*stream, GetBool(*v, "stream"));
  }
  if (const json* v = Find(body, "stream_options")) {
    if (!*stream) return FieldError("stream_options", "only allowed with \"stream\": true");
    if (!v->is_object()) return FieldError("stream_options", "must be an object");
    if (const json* u = Find(*v, "include_usage")) {
      ASSIGN_OR_RETURN(*include_usage, GetBool(*u, "stream_options.include_usage"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<json> ParseBody(absl::string_view json_body, size_t max_body_bytes) {
  if (json_body.size() > max_body_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("request body of ", json_body.size(),
                                                   " bytes exceeds the limit of ", max_body_bytes));
  }
  json body = json::parse(json_body.begin(), json_body.end(), nullptr,
                          /*allow_exceptions=*/false);
  if (body.is_discarded()) return absl::InvalidArgumentError("request body is not valid JSON");
  if (!body.is_object()) return absl::InvalidArgumentError("request body must be a JSON object");
  return body;
}

}  // namespace mmserve::router::openai_fields
