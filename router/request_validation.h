// The router's checks of a GenerateRequest, shared by the gRPC and HTTP
// front ends: everything decided before any backend is called. Pure
// functions, no I/O, thread-safe.
//
//   ASSIGN_OR_RETURN(std::vector<PreparedMedia> images, PrepareRequest(options, request));
//   // images[k].hash places image k; images[k].grid (when options.presize)
//   // tells the language side how many embedding rows to allocate.
//
// Every refusal is INVALID_ARGUMENT with a reason that names the field.
#ifndef MMSERVE_ROUTER_REQUEST_VALIDATION_H_
#define MMSERVE_ROUTER_REQUEST_VALIDATION_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/hash.h"
#include "model/image_tokens.h"
#include "model/model_config.h"
#include "model/video_decode.h"
#include "proto/inference.pb.h"

namespace mmserve::router {

inline constexpr size_t kMaxRequestIdBytes = 128;

struct RouterOptions {
  std::string model_id;
  model::ModelConfig config;
  int max_model_len = 4096;
  // Read image headers and send exact token counts (else the language side
  // allocates the default and resumes).
  bool presize = true;
  int max_images = 16;
  // An image's affinity encoder counts as saturated with this many images
  // queued (its last load report); the least loaded encoder takes it then.
  int encoder_saturation = 32;
  size_t max_image_bytes = size_t{20} << 20;
  int64_t max_image_pixels = 89478485;
  // Videos (router/request_media.h): encoded bytes (a file, or a frame
  // list's frames together), and what the container header may claim.
  size_t max_video_bytes = size_t{64} << 20;
  model::VideoLimits video_limits;
  // Prompt text bytes refused before tokenizing (router/input_limits.h);
  // 0: no check.
  size_t max_prompt_bytes = 0;
  // Times a call's language stream may move to another instance after the
  // one generating it was lost (role both; 0: the call ends UNAVAILABLE).
  int migration_limit = 1;
  // Images of a call placed on an instance (P/D: the prefill instance)
  // whose prefix index entry holds their message's KV go to no encoder
  // (PromptImage.expect_cached); false: every image goes to an encoder.
  bool skip_cached_images = true;
  // Deadline of calls that come without one.
  absl::Duration default_timeout = absl::Seconds(600);
};

// Every image of the request in order of appearance (chat parts or raw).
std::vector<const mmserve::v1::Image*> RequestImages(const mmserve::v1::GenerateRequest& request);

// The checks that need no image decoding: request id, model, chat roles or
// raw text/token ids and placeholders, image count and bytes, sampling
// values (the same SamplingFromProto the language side uses).
[[nodiscard]] absl::Status ValidateRequest(const RouterOptions& options,
                                           const mmserve::v1::GenerateRequest& request);

struct PreparedMedia {
  // XXH3-128 of an image's bytes; model::VideoContentHash of a video.
  ContentHash hash;
  bool video = false;
  // The exact grid from the image header and the encoder's smart resize;
  // empty when options.presize is off.
  std::optional<model::MediaGrid> grid;
  // A Qwen3-VL video's temporal patches' timestamps (its prompt shows them).
  std::vector<double> timestamps;
};

// ValidateRequest, then every image's and video's content hash (in
// RequestMedia order) and, with options.presize, its header read and limits
// and its grid.
[[nodiscard]] absl::StatusOr<std::vector<PreparedMedia>> PrepareRequest(
    const RouterOptions& options, const mmserve::v1::GenerateRequest& request);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_REQUEST_VALIDATION_H_
