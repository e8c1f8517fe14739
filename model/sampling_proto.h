// The public API's SamplingParams (proto/common.proto) as the sampler's
// SamplingParams: unset fields take the model's generation_config.json
// defaults, then the documented ones, and every value is validated
// (InvalidArgument naming the field). The router calls this to refuse bad
// requests early; the language service to run them.
//
//   bool to_context = false;
//   ASSIGN_OR_RETURN(SamplingParams p, SamplingFromProto(request.sampling(), cfg, max_len,
//                                                        &to_context));
//
// An unset max_tokens means "up to the context length": `max_tokens` is then
// max_model_len and *max_tokens_to_context is set, for the caller to lower
// once it knows the prompt's length. An unset seed is drawn at random (and
// reported back to the client). Thread-safe.
#ifndef MMSERVE_MODEL_SAMPLING_PROTO_H_
#define MMSERVE_MODEL_SAMPLING_PROTO_H_

#include "absl/status/statusor.h"
#include "model/model_config.h"
#include "model/sampling.h"
#include "proto/common.pb.h"

namespace mmserve::model {

[[nodiscard]] absl::StatusOr<SamplingParams> SamplingFromProto(const mmserve::v1::SamplingParams& p,
                                                               const ModelConfig& config,
                                                               int max_model_len,
                                                               bool* max_tokens_to_context);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_SAMPLING_PROTO_H_
