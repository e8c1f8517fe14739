// The properties of the router's request checks (router/request_validation.h)
// that both request fuzz targets assert, on whatever GenerateRequest they
// built (from proto bytes or from an OpenAI JSON body).
//
//   const router::RouterOptions& o = FuzzRouterOptions();
//   absl::Status s = CheckPrepareRequest(o, request);  // aborts on a broken property
//
// The options are the router's for model/testdata's tiny vision model
// (qwen2vl-tiny-mha-tied, read relative to the workspace root) with the
// image pixel limit lowered to 2^20 so that each run stays fast; the limit
// check itself is still exercised.
#ifndef MMSERVE_FUZZ_ROUTER_REQUEST_CHECK_H_
#define MMSERVE_FUZZ_ROUTER_REQUEST_CHECK_H_

#include "absl/status/status.h"
#include "proto/inference.pb.h"
#include "router/request_validation.h"

namespace mmserve::fuzz {

// Presize on (the router's default).
const router::RouterOptions& FuzzRouterOptions();

// Runs PrepareRequest on `request` and checks, aborting on a failure:
//  - a refusal is INVALID_ARGUMENT with a non-empty message, and the same
//    refusal as ValidateRequest's when that refuses;
//  - idempotent: a second call and a call on the request after a wire round
//    trip (what the gRPC server hands the router) give the same status,
//    hashes and grids;
//  - with presize off the verdict is ValidateRequest's, no image has a grid,
//    and an accepted request gets the same hashes;
//  - accepted: one entry per image of RequestImages, each hash the image's
//    HashBytes, each with a grid; and when the encoder's decode of the image
//    succeeds (under the same pixel and byte limits) its preprocessing gives
//    exactly that grid (the header the router reads agrees with the decode
//    the encoder runs); a decode that fails does so with INVALID_ARGUMENT.
// Returns PrepareRequest's status.
absl::Status CheckPrepareRequest(const router::RouterOptions& options,
                                 const mmserve::v1::GenerateRequest& request);

}  // namespace mmserve::fuzz

#endif  // MMSERVE_FUZZ_ROUTER_REQUEST_CHECK_H_
