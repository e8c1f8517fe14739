#include "router/request_media.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "model/chat_template.h"
#include "model/video_request.h"

namespace mmserve::router {
namespace {

absl::Status Invalid(absl::string_view why) { return absl::InvalidArgumentError(why); }

int64_t VideoBytes(const mmserve::v1::Video& v) {
  if (!v.has_frames()) return static_cast<int64_t>(v.data().size());
  int64_t n = 0;
  for (const auto& f : v.frames().frames()) n += static_cast<int64_t>(f.data().size());
  return n;
}

size_t CountOf(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

std::vector<MediaPart> RequestMedia(const mmserve::v1::GenerateRequest& r) {
  std::vector<MediaPart> out;
  if (r.has_chat()) {
    for (const auto& m : r.chat().messages()) {
      for (const auto& p : m.content()) {
        if (p.has_image()) out.push_back({&p.image(), nullptr});
        if (p.has_video()) out.push_back({nullptr, &p.video()});
      }
    }
    return out;
  }
  if (!r.has_raw()) return out;
  // Placeholders in text order; each takes the next image or video.
  const std::string& text = r.raw().text();
  int next_image = 0, next_video = 0;
  const std::string image_ph = model::kQwen2VlImagePlaceholder;
  const std::string video_ph = model::kQwen2VlVideoPlaceholder;
  for (size_t at = 0; at < text.size();) {
    const size_t i = text.find(image_ph, at);
    const size_t v = text.find(video_ph, at);
    if (i == std::string::npos && v == std::string::npos) break;
    if (v == std::string::npos || (i != std::string::npos && i < v)) {
      if (next_image < r.raw().images_size()) out.push_back({&r.raw().images(next_image), nullptr});
      ++next_image;
      at = i + image_ph.size();
    } else {
      if (next_video < r.raw().videos_size()) out.push_back({nullptr, &r.raw().videos(next_video)});
      ++next_video;
      at = v + video_ph.size();
    }
  }
  // Extra media without placeholders (ValidateRequest refuses them) last.
  for (int k = next_image; k < r.raw().images_size(); ++k)
    out.push_back({&r.raw().images(k), nullptr});
  for (int k = next_video; k < r.raw().videos_size(); ++k)
    out.push_back({nullptr, &r.raw().videos(k)});
  return out;
}

absl::Status ValidateVideos(const RouterOptions& options,
                            const mmserve::v1::GenerateRequest& request) {
  if (request.has_chat()) {
    for (int i = 0; i < request.chat().messages_size(); ++i) {
      const auto& m = request.chat().messages(i);
      for (const auto& p : m.content()) {
        if (p.has_video() && m.role() != "user") {
          return Invalid(absl::StrCat("chat.messages[", i, "]: only user messages hold videos"));
        }
      }
    }
  } else if (request.has_raw()) {
    const auto& raw = request.raw();
    if (raw.token_ids_size() > 0 && raw.videos_size() > 0) {
      return Invalid("raw: give text (with videos) or token_ids, not both");
    }
    const size_t placeholders = CountOf(raw.text(), std::string(model::kQwen2VlVideoPlaceholder));
    if (placeholders != static_cast<size_t>(raw.videos_size())) {
      return Invalid(absl::StrCat("raw.text has ", placeholders, " video placeholders but ",
                                  raw.videos_size(), " videos were sent"));
    }
  }
  const std::vector<MediaPart> media = RequestMedia(request);
  int k = 0, videos = 0;
  for (const MediaPart& m : media) {
    if (m.video != nullptr) {
      ++videos;
      if (m.video->source_case() == mmserve::v1::Video::kUrl) {
        return Invalid(absl::StrCat("video ", k, " is a URL, which this server does not fetch"));
      }
      const int64_t bytes = VideoBytes(*m.video);
      if (bytes == 0) return Invalid(absl::StrCat("video ", k, " is empty"));
      if (bytes > static_cast<int64_t>(options.max_video_bytes)) {
        return Invalid(
            absl::StrCat("video ", k, " has ", bytes, " bytes; at most ", options.max_video_bytes));
      }
    }
    ++k;
  }
  if (videos > 0 && !options.config.vision) return Invalid("this model does not accept videos");
  if (videos > 0 && options.config.DeepstackLevels() > 0 &&
      !options.config.preprocessor->qwen3_video) {
    // Its prompt shows each temporal patch's time, by its video processor's
    // sampling: without that processor's config there is none to follow.
    return Invalid(
        "videos are not served for this Qwen3-VL model: it has no Qwen3-VL video "
        "processor config");
  }
  if (videos > 0 && static_cast<int>(media.size()) > options.max_images) {
    return Invalid(absl::StrCat(media.size(), " images and videos; at most ", options.max_images,
                                " per request"));
  }
  return absl::OkStatus();
}

absl::StatusOr<PreparedMedia> PrepareVideo(const RouterOptions& options,
                                           const mmserve::v1::Video& video, size_t k) {
  PreparedMedia out;
  out.video = true;
  out.hash = model::VideoContentHash(video);
  if (options.config.preprocessor->qwen3_video) {
    // Qwen3-VL's prompt shows each temporal patch's time: from the header.
    absl::StatusOr<std::vector<double>> t = model::VideoTimestampsFromHeaders(
        video, *options.config.preprocessor, options.video_limits);
    if (!t.ok()) {
      return Invalid(
          absl::StrCat("video ", k, ": ", absl::StripPrefix(t.status().message(), "video: ")));
    }
    out.timestamps = *std::move(t);
  }
  if (!options.presize) {
    // Still refuse bad options before the encoder is called.
    absl::Status s = model::VideoOptionsFor(video, *options.config.preprocessor).status();
    if (!s.ok())
      return Invalid(absl::StrCat("video ", k, ": ", absl::StripPrefix(s.message(), "video: ")));
    return out;
  }
  model::DecodeLimits frame_limits;
  frame_limits.max_pixels = options.max_image_pixels;
  absl::StatusOr<model::MediaGrid> g = model::VideoGridFromHeaders(
      video, *options.config.preprocessor, options.video_limits, frame_limits);
  if (!g.ok()) {
    return Invalid(
        absl::StrCat("video ", k, ": ", absl::StripPrefix(g.status().message(), "video: ")));
  }
  out.grid = *g;
  return out;
}

}  // namespace mmserve::router
