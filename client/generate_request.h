// Builds the GenerateRequest a command-line client sends, and prints
// responses.
//
//   GenerateOptions options;
//   options.prompt = "Where is the red square?";
//   options.image_paths = {"shapes/0000.png"};
//   options.sampling.set_temperature(0);
//   ASSIGN_OR_RETURN(mmserve::v1::GenerateRequest request, BuildGenerateRequest(options));
//
// Pure functions except that BuildGenerateRequest reads the image files.
// Thread-safe.
#ifndef MMSERVE_CLIENT_GENERATE_REQUEST_H_
#define MMSERVE_CLIENT_GENERATE_REQUEST_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "proto/inference.pb.h"

namespace mmserve::client {

// The placeholder a raw prompt holds for each image.
inline constexpr char kImagePlaceholder[] = "<|vision_start|><|image_pad|><|vision_end|>";
// The placeholder a raw prompt holds for each video.
inline constexpr char kVideoPlaceholder[] = "<|vision_start|><|video_pad|><|vision_end|>";

struct GenerateOptions {
  std::string model;                     // "" = the only served model
  std::string request_id;                // "" = the router assigns one
  std::string prompt;                    // the user's message, or the whole prompt with raw
  std::vector<std::string> image_paths;  // read and sent as bytes, in order
  std::vector<std::string> video_paths;  // video files (mp4, webm, ...), after the images
  double video_fps = 0;                  // frames sampled per second (0: every frame)
  uint32_t video_max_frames = 0;         // sampled-frame cap with video_fps (0: default)
  std::string system;                    // chat only: a system turn first, when not empty
  bool raw = false;                      // RawPrompt instead of a chat
  mmserve::v1::SamplingParams sampling;  // fields left unset take the model's defaults
  bool include_token_ids = false;        // ask for token ids with each response
};

// Chat: [system turn], then one user turn holding the images, then the
// videos (in order) followed by the prompt text. Raw: the prompt as is with
// the images and videos, whose counts must match the prompt's placeholders. Always asks for usage
// and timing. INVALID_ARGUMENT for an empty request or a placeholder mismatch; an unreadable image
// file is NOT_FOUND naming the path.
[[nodiscard]] absl::StatusOr<mmserve::v1::GenerateRequest> BuildGenerateRequest(
    const GenerateOptions& options);

// "image/png" etc. from the file extension, "" when unknown (the server
// detects the format from the bytes anyway).
std::string MimeTypeForPath(const std::string& path);

// One message as a single line of JSON (protobuf's JSON mapping, field names
// in lowerCamelCase, defaults omitted), without a trailing newline.
std::string JsonLine(const google::protobuf::Message& message);

// The final response's summary for stderr, e.g. "finish_reason=stop
// prompt_tokens=31 completion_tokens=3 cached_prompt_tokens=0 ttft_ms=41.2
// e2e_ms=80.5 seed=42".
std::string FinalSummary(const mmserve::v1::GenerateResponse& response);

}  // namespace mmserve::client

#endif  // MMSERVE_CLIENT_GENERATE_REQUEST_H_
