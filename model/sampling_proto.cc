#include "model/sampling_proto.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mmserve::model {
namespace {

// The oneof as a grammar::ConstraintSpec (validated later, with the rest).
absl::StatusOr<grammar::ConstraintSpec> ConstraintFromProto(
    const mmserve::v1::OutputConstraint& c) {
  using Kind = grammar::ConstraintSpec::Kind;
  using Proto = mmserve::v1::OutputConstraint;
  grammar::ConstraintSpec spec;
  switch (c.kind_case()) {
    case Proto::kJsonObject:
      if (!c.json_object()) {
        return absl::InvalidArgumentError("constraint.json_object must be true when set");
      }
      spec.kind = Kind::kJsonObject;
      break;
    case Proto::kJsonSchema:
      spec.kind = Kind::kJsonSchema;
      spec.text = c.json_schema();
      break;
    case Proto::kRegex:
      spec.kind = Kind::kRegex;
      spec.text = c.regex();
      break;
    case Proto::kGrammar:
      spec.kind = Kind::kEbnf;
      spec.text = c.grammar();
      break;
    case Proto::KIND_NOT_SET:
      return absl::InvalidArgumentError(
          "constraint: set one of json_object, json_schema, regex or grammar");
  }
  if (c.strict() && spec.kind != Kind::kJsonSchema) {
    return absl::InvalidArgumentError("constraint.strict applies to json_schema only");
  }
  spec.strict = c.strict();
  return spec;
}

}  // namespace

absl::StatusOr<SamplingParams> SamplingFromProto(const mmserve::v1::SamplingParams& in,
                                                 const ModelConfig& config, int max_model_len,
                                                 bool* max_tokens_to_context) {
  const GenerationDefaults& g = config.generation;
  SamplingParams p;
  p.temperature = in.has_temperature() ? in.temperature() : g.temperature.value_or(1.0f);
  p.top_p = in.has_top_p() ? in.top_p() : g.top_p.value_or(1.0f);
  p.top_k = in.has_top_k() ? in.top_k() : g.top_k.value_or(0);
  p.min_p = in.has_min_p() ? in.min_p() : 0.0f;
  if (in.has_seed()) {
    p.seed = in.seed();
  } else {
    std::random_device rd;
    p.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  *max_tokens_to_context = !in.has_max_tokens();
  if (in.has_max_tokens()) {
    if (in.max_tokens() < 1 || in.max_tokens() > static_cast<uint32_t>(max_model_len)) {
      return absl::InvalidArgumentError(absl::StrCat("max_tokens must be in [1, ", max_model_len,
                                                     "] (the context length), got ",
                                                     in.max_tokens()));
    }
    p.max_tokens = static_cast<int>(in.max_tokens());
  } else {
    p.max_tokens = max_model_len;
  }
  if (in.min_tokens() > static_cast<uint32_t>(max_model_len)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_tokens must be at most max_tokens, got ", in.min_tokens()));
  }
  p.min_tokens = static_cast<int>(in.min_tokens());
  p.stop.assign(in.stop().begin(), in.stop().end());
  for (uint32_t id : in.stop_token_ids()) {
    if (id >= static_cast<uint32_t>(config.text.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stop_token_ids: ", id, " is outside the vocabulary [0, ", config.text.vocab_size, ")"));
    }
    p.stop_token_ids.push_back(static_cast<int32_t>(id));
  }
  p.ignore_eos = in.ignore_eos();
  if (in.has_logprobs()) {
    if (in.logprobs() > static_cast<uint32_t>(kMaxLogprobs)) {
      return absl::InvalidArgumentError(
          absl::StrCat("logprobs must be in [0, ", kMaxLogprobs, "], got ", in.logprobs()));
    }
    p.logprobs = static_cast<int>(in.logprobs());
  }
  p.skip_special_tokens = in.has_skip_special_tokens() ? in.skip_special_tokens() : true;
  p.presence_penalty = in.has_presence_penalty() ? in.presence_penalty() : 0.0f;
  p.frequency_penalty = in.has_frequency_penalty() ? in.frequency_penalty() : 0.0f;
  // generation_config.json's repetition_penalty is not a default: the
  // greedy outputs clients and goldens rely on are those of 1.
  p.repetition_penalty = in.has_repetition_penalty() ? in.repetition_penalty() : 1.0f;
  if (in.logit_bias_size() > kMaxLogitBiasEntries) {
    return absl::InvalidArgumentError(absl::StrCat("logit_bias: at most ", kMaxLogitBiasEntries,
                                                   " entries, got ", in.logit_bias_size()));
  }
  for (const mmserve::v1::LogitBias& b : in.logit_bias()) {
    if (b.token_id() >= static_cast<uint32_t>(config.text.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias: token ", b.token_id(),
                                                     " is outside the vocabulary [0, ",
                                                     config.text.vocab_size, ")"));
    }
    p.logit_bias.push_back({static_cast<int32_t>(b.token_id()), b.bias()});
  }
  // The sampler adds the biases in token order, each token once.
  std::sort(p.logit_bias.begin(), p.logit_bias.end(),
            [](const TokenBias& a, const TokenBias& b) { return a.token < b.token; });
  for (size_t i = 1; i < p.logit_bias.size(); ++i) {
    if (p.logit_bias[i].token == p.logit_bias[i - 1].token) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias: token ", p.logit_bias[i].token, " appears more than once"));
    }
  }
  if (in.has_constraint()) {
    ASSIGN_OR_RETURN(p.constraint, ConstraintFromProto(in.constraint()));
  }
  RETURN_IF_ERROR(ValidateSamplingParams(p, config.text.vocab_size));
  return p;
}

}  // namespace mmserve::model
