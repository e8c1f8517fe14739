#include "language_service/prompt_media.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "model/chat_proto.h"
#include "model/chat_template.h"
#include "model/qwen3vl_video.h"

namespace mmserve::language {
namespace {

const char* KindName(model::MediaKind kind) {
  return kind == model::MediaKind::kVideo ? "a video" : "an image";
}

// The placeholders of raw text in order of appearance.
std::vector<model::MediaKind> RawSlots(const std::string& text) {
  std::vector<model::MediaKind> slots;
  const std::string image = model::kQwen2VlImagePlaceholder;
  const std::string video = model::kQwen2VlVideoPlaceholder;
  size_t at = 0;
  while (true) {
    const size_t i = text.find(image, at), v = text.find(video, at);
    if (i == std::string::npos && v == std::string::npos) break;
    const bool is_video = v < i;
    slots.push_back(is_video ? model::MediaKind::kVideo : model::MediaKind::kImage);
    at = (is_video ? v : i) + 1;
  }
  return slots;
}

}  // namespace

absl::StatusOr<std::string> RenderPrompt(const v1::PrefillRequest& request,
                                         model::ChatFamily family,
                                         std::vector<model::MediaKind>* slots) {
  slots->clear();
  if (request.has_chat()) {
    std::vector<model::ChatMessage> messages;
    model::ChatOptions opts;
    model::ChatFromProto(request.chat(), &messages, &opts);
    for (const model::ChatMessage& m : messages) {
      for (const model::ChatPart& part : m.parts) {
        if (part.kind == model::ChatPart::Kind::kImage) slots->push_back(model::MediaKind::kImage);
        if (part.kind == model::ChatPart::Kind::kVideo) slots->push_back(model::MediaKind::kVideo);
      }
    }
    return model::RenderChat(family, messages, opts);
  }
  if (request.has_raw()) {
    *slots = RawSlots(request.raw().text());
    return request.raw().text();
  }
  return absl::InvalidArgumentError("the request has no prompt (chat or raw)");
}

absl::Status CheckPromptMedia(absl::Span<const model::MediaKind> slots,
                              const v1::PrefillRequest& request) {
  if (slots.size() != static_cast<size_t>(request.images_size())) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", slots.size(),
                                                   " image parts but the request describes ",
                                                   request.images_size(), " images"));
  }
  for (int k = 0; k < request.images_size(); ++k) {
    absl::StatusOr<model::MediaKind> kind = MediaKindFromProto(request.images(k).kind());
    if (!kind.ok()) return kind.status();
    if (*kind != slots[k]) {
      return absl::InvalidArgumentError(
          absl::StrCat("part ", k, " of the prompt is ", KindName(slots[k]),
                       " but the request describes ", KindName(*kind)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> WithVideoTimestamps(std::string prompt,
                                                const v1::PrefillRequest& request) {
  std::vector<model::Qwen3VideoPrompt> videos;
  size_t stamped = 0;
  for (const v1::PromptImage& image : request.images()) {
    if (image.kind() != v1::MEDIA_KIND_VIDEO) continue;
    videos.push_back({{image.timestamps().begin(), image.timestamps().end()}, 1});
    if (image.timestamps_size() > 0) ++stamped;
  }
  if (stamped == 0 || prompt.empty()) return prompt;
  if (stamped != videos.size()) {
    return absl::InvalidArgumentError(absl::StrCat(stamped, " of the request's ", videos.size(),
                                                   " videos carry their frames' timestamps"));
  }
  return model::ExpandQwen3VideoPrompt(prompt, videos);
}

absl::StatusOr<model::MediaKind> MediaKindFromProto(int kind) {
  switch (kind) {
    case v1::MEDIA_KIND_IMAGE:
      return model::MediaKind::kImage;
    case v1::MEDIA_KIND_VIDEO:
      return model::MediaKind::kVideo;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown media kind ", kind));
  }
}

v1::MediaKind MediaKindToProto(model::MediaKind kind) {
  return kind == model::MediaKind::kVideo ? v1::MEDIA_KIND_VIDEO : v1::MEDIA_KIND_IMAGE;
}

absl::Status CheckImageSource(const v1::PromptImage& image, model::MediaKind slot) {
  if (!image.expect_cached()) {
    if (image.encoder_id().empty() || image.encoder_address().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("image ", image.image_index(), " names no encoder"));
    }
    return absl::OkStatus();
  }
  if (slot != model::MediaKind::kImage || image.grid_t() == 0 || image.grid_h() == 0 ||
      image.grid_w() == 0 || !image.encoder_id().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("image ", image.image_index(),
                     ": expect_cached is for an image with its grid and no encoder"));
  }
  return absl::OkStatus();
}

}  // namespace mmserve::language
