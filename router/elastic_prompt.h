// A request's exact length for the elastic manager (router
// --elastic): the prompt in tokens as the language side will see it (the chat
// rendered with the model's template, or the raw text, tokenized, each
// image or video placeholder expanded to its embedding rows) and the most
// tokens it may generate. A group plan splits exactly these rows.
//
//   ASSIGN_OR_RETURN(ElasticLength n, ElasticRequestLength(options, tokenizer, request, images));
//
// Thread-safe (pure functions; the tokenizer is read only).
#ifndef MMSERVE_ROUTER_ELASTIC_PROMPT_H_
#define MMSERVE_ROUTER_ELASTIC_PROMPT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "model/tokenizer.h"
#include "proto/inference.pb.h"
#include "router/request_validation.h"

namespace mmserve::router {

struct ElasticLength {
  int64_t prompt_tokens = 0;
  int64_t max_tokens = 1;  // sampling.max_tokens, else what the context leaves
};

// `images` as PrepareRequest gave them, each with its grid (options.presize;
// FAILED_PRECONDITION otherwise). INVALID_ARGUMENT when the prompt and
// max_tokens exceed options.max_model_len (as the language side would
// answer); FAILED_PRECONDITION for text without a tokenizer.
[[nodiscard]] absl::StatusOr<ElasticLength> ElasticRequestLength(
    const RouterOptions& options, const model::Tokenizer* tokenizer,
    const mmserve::v1::GenerateRequest& request, const std::vector<PreparedMedia>& images);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_ELASTIC_PROMPT_H_
