// The messages a Generate call builds from its request: the Prefill request
// a language instance gets, and the public response for each batch of the
// internal token stream. Pure functions; thread-safe.
#ifndef MMSERVE_ROUTER_CALL_MESSAGES_H_
#define MMSERVE_ROUTER_CALL_MESSAGES_H_

#include <string>
#include <vector>

#include "proto/inference.pb.h"
#include "proto/language.pb.h"

namespace mmserve::router {

// The language side's request for `request` (call `id`, served model
// `model`): its chat or raw prompt with every image's bytes left out (the
// encoders send the embeddings), its sampling, stream options and
// priority, and `images` describing each image.
internal::v1::PrefillRequest PrefillRequestFor(const mmserve::v1::GenerateRequest& request,
                                               const std::string& id, const std::string& model,
                                               std::vector<internal::v1::PromptImage> images);

// The public response for a batch of the internal token stream. The one
// place where the internal batch's finish (reason, matched stop, usage,
// seed, timing) becomes the public response's.
mmserve::v1::GenerateResponse ToResponse(const internal::v1::TokenBatch& batch,
                                         const mmserve::v1::GenerateRequest& request);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_CALL_MESSAGES_H_
