#include "client/generate_request.h"

#include <google/protobuf/util/json_util.h>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/file.h"
#include "common/status_macros.h"

namespace mmserve::client {
namespace {

size_t CountOccurrences(absl::string_view text, absl::string_view needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != absl::string_view::npos;
       at = text.find(needle, at + needle.size())) {
    ++count;
  }
  return count;
}

// The bytes of a --image/--video file; NOT_FOUND etc. naming the flag and
// path, INVALID_ARGUMENT when empty.
absl::StatusOr<std::string> ReadFlagFile(absl::string_view flag, const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(),
                        absl::StrCat("--", flag, " ", path, ": ", bytes.status().message()));
  }
  if (bytes->empty())
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", path, ": empty"));
  return bytes;
}

absl::StatusOr<mmserve::v1::Image> ReadImage(const std::string& path) {
  mmserve::v1::Image image;
  ASSIGN_OR_RETURN(*image.mutable_data(), ReadFlagFile("image", path));
  image.set_mime_type(MimeTypeForPath(path));
  return image;
}

absl::StatusOr<mmserve::v1::Video> ReadVideo(const std::string& path,
                                             const GenerateOptions& options) {
  mmserve::v1::Video video;
  ASSIGN_OR_RETURN(*video.mutable_data(), ReadFlagFile("video", path));
  video.set_mime_type(MimeTypeForPath(path));
  if (options.video_fps > 0) video.set_fps(options.video_fps);
  if (options.video_max_frames > 0) video.set_max_frames(options.video_max_frames);
  return video;
}

}  // namespace

std::string MimeTypeForPath(const std::string& path) {
  size_t dot = path.rfind('.');
  if (dot == std::string::npos || path.find('/', dot) != std::string::npos) return "";
  std::string ext = absl::AsciiStrToLower(path.substr(dot + 1));
  if (ext == "png") return "image/png";
  if (ext == "jpg" || ext == "jpeg") return "image/jpeg";
  if (ext == "bmp") return "image/bmp";
  if (ext == "gif") return "image/gif";
  if (ext == "mp4" || ext == "m4v") return "video/mp4";
  if (ext == "webm") return "video/webm";
  if (ext == "mkv") return "video/x-matroska";
  if (ext == "mov") return "video/quicktime";
  if (ext == "avi") return "video/x-msvideo";
  return "";
}

absl::StatusOr<mmserve::v1::GenerateRequest> BuildGenerateRequest(const GenerateOptions& options) {
  if (options.prompt.empty() && options.image_paths.empty() && options.video_paths.empty()) {
    return absl::InvalidArgumentError("nothing to send: give --prompt and/or --image/--video");
  }
  mmserve::v1::GenerateRequest request;
  request.set_model(options.model);
  request.set_request_id(options.request_id);
  *request.mutable_sampling() = options.sampling;
  request.mutable_stream()->set_include_usage(true);
  request.mutable_stream()->set_include_timing(true);
  request.mutable_stream()->set_include_token_ids(options.include_token_ids);

  if (options.raw) {
    size_t placeholders = CountOccurrences(options.prompt, kImagePlaceholder);
    if (placeholders != options.image_paths.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--raw prompt holds ", placeholders, " image placeholder(s) ", kImagePlaceholder, " but ",
          options.image_paths.size(), " --image were given"));
    }
    const size_t video_placeholders = CountOccurrences(options.prompt, kVideoPlaceholder);
    if (video_placeholders != options.video_paths.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--raw prompt holds ", video_placeholders, " video placeholder(s) ", kVideoPlaceholder,
          " but ", options.video_paths.size(), " --video were given"));
    }
    if (!options.system.empty()) {
      return absl::InvalidArgumentError("--system has no meaning with --raw");
    }
    mmserve::v1::RawPrompt* raw = request.mutable_raw();
    raw->set_text(options.prompt);
    for (const std::string& path : options.image_paths) {
      ASSIGN_OR_RETURN(*raw->add_images(), ReadImage(path));
    }
    for (const std::string& path : options.video_paths) {
      ASSIGN_OR_RETURN(*raw->add_videos(), ReadVideo(path, options));
    }
    return request;
  }

  mmserve::v1::Chat* chat = request.mutable_chat();
  if (!options.system.empty()) {
    mmserve::v1::ChatMessage* system = chat->add_messages();
    system->set_role("system");
    system->add_content()->set_text(options.system);
  }
  mmserve::v1::ChatMessage* user = chat->add_messages();
  user->set_role("user");
  for (const std::string& path : options.image_paths) {
    ASSIGN_OR_RETURN(*user->add_content()->mutable_image(), ReadImage(path));
  }
  for (const std::string& path : options.video_paths) {
    ASSIGN_OR_RETURN(*user->add_content()->mutable_video(), ReadVideo(path, options));
  }
  if (!options.prompt.empty()) user->add_content()->set_text(options.prompt);
  return request;
}

std::string JsonLine(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = false;
  options.preserve_proto_field_names = false;
  std::string out;
  // Only fails for messages with Any fields of unknown types; ours have none.
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

std::string FinalSummary(const mmserve::v1::GenerateResponse& response) {
  absl::string_view finish = mmserve::v1::FinishReason_Name(response.finish_reason());
  absl::ConsumePrefix(&finish, "FINISH_REASON_");
  std::string out = absl::StrCat("finish_reason=", absl::AsciiStrToLower(finish));
  if (!response.matched_stop().empty()) {
    absl::StrAppend(&out, " matched_stop=\"", absl::CEscape(response.matched_stop()), "\"");
  }
  if (response.has_usage()) {
    const mmserve::v1::Usage& u = response.usage();
    absl::StrAppend(&out, " prompt_tokens=", u.prompt_tokens(),
                    " completion_tokens=", u.completion_tokens(),
                    " cached_prompt_tokens=", u.cached_prompt_tokens(),
                    " image_tokens=", u.image_tokens(), " cached_images=", u.cached_images());
  }
  if (response.has_timing()) {
    const mmserve::v1::RequestTiming& t = response.timing();
    absl::StrAppend(&out, absl::StrFormat(" ttft_ms=%.1f e2e_ms=%.1f", t.ttft_ms(), t.e2e_ms()));
    if (t.multimodal_ms() > 0) {
      absl::StrAppend(&out, absl::StrFormat(" multimodal_ms=%.1f", t.multimodal_ms()));
    }
  }
  absl::StrAppend(&out, " seed=", response.seed());
  return out;
}

}  // namespace mmserve::client
