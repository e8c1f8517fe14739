// Video parts at the router: one index space with images (chat order, raw
// placeholder order), exact grids from headers, limits refused with
// INVALID_ARGUMENT and the reason before any decode, and the OpenAI
// video_url part.
#include "router/request_media.h"

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "common/file.h"
#include "model/chat_template.h"
#include "model/video_request.h"
#include "router/openai.h"
#include "router/request_validation.h"

namespace mmserve::router {
namespace {

std::string Clip(const std::string& name) {
  auto bytes = ReadFileToString("model/testdata/video/" + name);
  INFO(name);
  REQUIRE(bytes.ok());
  return *bytes;
}

RouterOptions Options() {
  RouterOptions o;
  o.model_id = "m";
  o.config.text.vocab_size = 1000;
  o.config.vision = model::VisionConfig();
  o.config.preprocessor = model::PreprocessorConfig();
  o.config.preprocessor->min_pixels = 3136;
  o.config.preprocessor->max_pixels = 12544;
  return o;
}

mmserve::v1::GenerateRequest Chat(const std::string& role = "user") {
  mmserve::v1::GenerateRequest r;
  auto* m = r.mutable_chat()->add_messages();
  m->set_role(role);
  m->add_content()->mutable_image()->set_data(Clip("frames/png_45x30_x1_0.png"));
  auto* v = m->add_content()->mutable_video();
  v->set_data(Clip("clips/h264_96x64_21f.mp4"));
  v->set_fps(2.0);
  m->add_content()->set_text("what happens?");
  return r;
}

void CheckRefused(const absl::Status& s, absl::string_view reason) {
  INFO(s.ToString());
  CHECK(absl::IsInvalidArgument(s));
  CHECK(absl::StrContains(s.message(), reason));
}

TEST_CASE("a chat's images and videos share one index space with exact grids") {
  const mmserve::v1::GenerateRequest r = Chat();
  auto prepared = PrepareRequest(Options(), r);
  REQUIRE(prepared.ok());
  REQUIRE(prepared->size() == 2);
  CHECK_FALSE((*prepared)[0].video);
  CHECK((*prepared)[1].video);
  const auto& video = r.chat().messages(0).content(1).video();
  CHECK((*prepared)[1].hash == model::VideoContentHash(video));
  auto patches = model::LoadVideo(video, *Options().config.preprocessor, model::VideoLimits(),
                                  model::DecodeLimits());
  REQUIRE(patches.ok());
  REQUIRE((*prepared)[1].grid.has_value());
  CHECK((*prepared)[1].grid->grid_t == patches->grid.grid_t);
  CHECK((*prepared)[1].grid->num_tokens() == patches->grid.num_tokens());
  CHECK((*prepared)[1].grid->grid_t == 2);
}

TEST_CASE("raw placeholders order images and videos as they stand in the text") {
  mmserve::v1::GenerateRequest r;
  r.mutable_raw()->set_text(std::string("a ") + model::kQwen2VlVideoPlaceholder + " b " +
                            model::kQwen2VlImagePlaceholder);
  r.mutable_raw()->add_images()->set_data(Clip("frames/png_45x30_x1_0.png"));
  r.mutable_raw()->add_videos()->set_data(Clip("clips/vp9_70x54_16f.webm"));
  const auto media = RequestMedia(r);
  REQUIRE(media.size() == 2);
  CHECK(media[0].video != nullptr);
  CHECK(media[1].image != nullptr);
  auto prepared = PrepareRequest(Options(), r);
  REQUIRE(prepared.ok());
  CHECK((*prepared)[0].video);
  r.mutable_raw()->add_videos()->set_data("x");
  CheckRefused(PrepareRequest(Options(), r).status(), "1 video placeholders but 2 videos");
}

TEST_CASE("hostile videos are refused with the reason before any decode") {
  struct Case {
    std::string clip;
    std::string reason;
  };
  for (const Case& c :
       {Case{"clips/hours.mp4", "video 1: duration 7200 s exceeds"},
        Case{"clips/zero_frames.avi", "video 1: no frames"}, Case{"clips/8k_vp9.webm", "7680x4320"},
        Case{"clips/ffv1_32x32.mkv", "unsupported codec ffv1"},
        Case{"clips/audio_only.wav", "video 1: unknown, truncated or corrupt"}}) {
    mmserve::v1::GenerateRequest r = Chat();
    r.mutable_chat()->mutable_messages(0)->mutable_content(1)->mutable_video()->set_data(
        Clip(c.clip));
    CheckRefused(PrepareRequest(Options(), r).status(), c.reason);
  }
  RouterOptions small = Options();
  small.max_video_bytes = 100;
  CheckRefused(PrepareRequest(small, Chat()).status(), "video 1 has 8147 bytes; at most 100");
  CheckRefused(PrepareRequest(Options(), Chat("assistant")).status(),
               "only user messages hold images");
  mmserve::v1::GenerateRequest mixed = Chat();
  auto* frames = mixed.mutable_chat()->mutable_messages(0)->mutable_content(1)->mutable_video();
  frames->Clear();
  frames->mutable_frames()->add_frames()->set_data(Clip("frames/jpg_64x48_x5_0.jpg"));
  frames->mutable_frames()->add_frames()->set_data(Clip("frames/png_45x30_x1_0.png"));
  CheckRefused(PrepareRequest(Options(), mixed).status(), "video 1: frame 1 is 45x30");
  RouterOptions few = Options();
  few.max_images = 1;
  CheckRefused(PrepareRequest(few, Chat()).status(), "2 images and videos; at most 1");
}

TEST_CASE("a Qwen3-VL video gets its sampled frames' timestamps from the header") {
  RouterOptions qwen3vl = Options();
  qwen3vl.config.model_type = "qwen3_vl";
  qwen3vl.config.vision->deepstack_visual_indexes = {5, 11, 17};
  qwen3vl.config.preprocessor->patch_size = 16;
  qwen3vl.config.preprocessor->qwen3_video = model::Qwen3VideoSettings{.max_pixels = 16384};
  // 21 frames at 10 fps sampled at 2 fps: int(21 / 10 * 2) = 4 frames, 0 7
  // 13 20 (linspace), two temporal patches at (0 + 0.7) / 2 and (1.3 + 2) / 2
  // seconds; the budget of 16384 pixels over 4 frames of 96 x 64 shrinks
  // each to 64 x 32.
  auto prepared = PrepareRequest(qwen3vl, Chat());
  INFO(prepared.status().ToString());
  REQUIRE(prepared.ok());
  const PreparedMedia& video = (*prepared)[1];
  CHECK(video.timestamps == std::vector<double>{0.35, 1.65});
  REQUIRE(video.grid.has_value());
  CHECK(video.grid->grid_t == 2);
  CHECK(video.grid->resized_width == 64);
  CHECK(video.grid->resized_height == 32);
  CHECK((*prepared)[0].timestamps.empty());  // the image
  // A frame list has no frame rate to sample by: refused, naming why.
  mmserve::v1::GenerateRequest frames = Chat();
  auto* v = frames.mutable_chat()->mutable_messages(0)->mutable_content(1)->mutable_video();
  v->clear_fps();
  v->mutable_frames()->add_frames()->set_data(Clip("frames/png_45x30_x1_0.png"));
  CheckRefused(PrepareRequest(qwen3vl, frames).status(), "send the clip, not frames");
}

TEST_CASE("the OpenAI video_url part takes a data: or http(s) URL and sampling options") {
  const std::string url =
      "data:video/mp4;base64," + absl::Base64Escape(Clip("clips/h264_96x64_21f.mp4"));
  const std::string body = R"({"messages":[{"role":"user","content":[{"type":"video_url",
      "video_url":{"url":")" +
                           url + R"(","fps":2,"max_frames":8}},{"type":"text","text":"hi"}]}]})";
  auto chat = ParseChatCompletionRequest(body, OpenAiLimits());
  REQUIRE(chat.ok());
  const auto& part = chat->request.chat().messages(0).content(0);
  REQUIRE(part.has_video());
  CHECK(part.video().fps() == 2.0);
  CHECK(part.video().max_frames() == 8);
  CHECK(part.video().mime_type() == "video/mp4");
  CHECK(PrepareRequest(Options(), chat->request).ok());
  for (const auto& [u, reason] :
       {std::pair<std::string, std::string>{"https://u@example.com/a.mp4",
                                            "credentials in the URL are not allowed"},
        {"data:image/png;base64,AAAA", "is not a video (data:video/"}}) {
    const std::string b = R"({"messages":[{"role":"user","content":[{"type":"video_url",
        "video_url":{"url":")" +
                          u + R"("}}]}]})";
    CheckRefused(ParseChatCompletionRequest(b, OpenAiLimits()).status(), reason);
  }
  // An http(s) URL is kept for the fetch; one that reaches validation
  // unfetched is refused.
  const std::string remote = R"({"messages":[{"role":"user","content":[{"type":"video_url",
      "video_url":{"url":"https://example.com/a.mp4"}}]}]})";
  auto fetchable = ParseChatCompletionRequest(remote, OpenAiLimits());
  REQUIRE(fetchable.ok());
  CHECK(fetchable->request.chat().messages(0).content(0).video().url() ==
        "https://example.com/a.mp4");
  CheckRefused(PrepareRequest(Options(), fetchable->request).status(),
               "video 0 is a URL, which this server does not fetch");
}

}  // namespace
}  // namespace mmserve::router
