// The prompt's image and video slots against the request's PromptImages.
#include "language_service/prompt_media.h"

#include <catch2/catch.hpp>

#include "model/chat_template.h"

namespace mmserve::language {
namespace {

using model::MediaKind;

v1::PrefillRequest WithKinds(std::vector<v1::MediaKind> kinds) {
  v1::PrefillRequest r;
  for (size_t k = 0; k < kinds.size(); ++k) {
    v1::PromptImage* p = r.add_images();
    p->set_image_index(static_cast<uint32_t>(k));
    p->set_kind(kinds[k]);
  }
  return r;
}

TEST_CASE("raw text lists image and video placeholders in order", "[prompt_media]") {
  const std::string image = model::kQwen2VlImagePlaceholder;
  const std::string video = model::kQwen2VlVideoPlaceholder;
  v1::PrefillRequest r =
      WithKinds({v1::MEDIA_KIND_VIDEO, v1::MEDIA_KIND_IMAGE, v1::MEDIA_KIND_VIDEO});
  r.mutable_raw()->set_text(video + "a" + image + image.substr(0, 5) + video + "?");
  std::vector<MediaKind> slots;
  auto text = RenderPrompt(r, model::ChatFamily::kQwen2Vl, &slots);
  REQUIRE(text.ok());
  CHECK(*text == r.raw().text());
  CHECK(slots == std::vector<MediaKind>{MediaKind::kVideo, MediaKind::kImage, MediaKind::kVideo});
  CHECK(CheckPromptMedia(slots, r).ok());
  // The same kinds in another order, another count, an unknown kind.
  v1::PrefillRequest swapped =
      WithKinds({v1::MEDIA_KIND_IMAGE, v1::MEDIA_KIND_VIDEO, v1::MEDIA_KIND_VIDEO});
  CHECK(CheckPromptMedia(slots, swapped).message() ==
        "part 0 of the prompt is a video but the request describes an image");
  CHECK(CheckPromptMedia(slots, WithKinds({v1::MEDIA_KIND_VIDEO})).code() ==
        absl::StatusCode::kInvalidArgument);
  v1::PrefillRequest unknown = r;
  unknown.mutable_images(1)->set_kind(static_cast<v1::MediaKind>(7));
  CHECK(CheckPromptMedia(slots, unknown).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("chat video parts render as video placeholders", "[prompt_media]") {
  v1::PrefillRequest r = WithKinds({v1::MEDIA_KIND_IMAGE, v1::MEDIA_KIND_VIDEO});
  mmserve::v1::ChatMessage* m = r.mutable_chat()->add_messages();
  m->set_role("user");
  m->add_content()->mutable_image();
  m->add_content()->set_text("and");
  m->add_content()->mutable_video();
  std::vector<MediaKind> slots;
  auto text = RenderPrompt(r, model::ChatFamily::kQwen3Vl, &slots);
  REQUIRE(text.ok());
  CHECK(text->find(std::string(model::kQwen2VlImagePlaceholder) + "and" +
                   model::kQwen2VlVideoPlaceholder) != std::string::npos);
  CHECK(slots == std::vector<MediaKind>{MediaKind::kImage, MediaKind::kVideo});
  CHECK(CheckPromptMedia(slots, r).ok());
  CHECK(MediaKindToProto(MediaKind::kVideo) == v1::MEDIA_KIND_VIDEO);
}

TEST_CASE("a chat renders in the served model's family format", "[prompt_media]") {
  v1::PrefillRequest r;
  mmserve::v1::ChatMessage* m = r.mutable_chat()->add_messages();
  m->set_role("user");
  m->add_content()->set_text("hi");
  std::vector<MediaKind> slots;
  CHECK(*RenderPrompt(r, model::ChatFamily::kQwen3, &slots) ==
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  CHECK(RenderPrompt(r, model::ChatFamily::kQwen2Vl, &slots)
            ->rfind("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n", 0) == 0);
  m->add_content()->mutable_image();
  CHECK(RenderPrompt(r, model::ChatFamily::kQwen25, &slots).status().message() ==
        "message 0: this model does not accept images");
}

TEST_CASE("the chat's enable_thinking and reasoning_content reach the Qwen3 format",
          "[prompt_media]") {
  v1::PrefillRequest r;
  mmserve::v1::Chat* chat = r.mutable_chat();
  mmserve::v1::ChatMessage* user = chat->add_messages();
  user->set_role("user");
  user->add_content()->set_text("q");
  mmserve::v1::ChatMessage* answer = chat->add_messages();
  answer->set_role("assistant");
  answer->add_content()->set_text("a");
  answer->set_reasoning_content("r");
  chat->set_add_generation_prompt(false);
  std::vector<MediaKind> slots;
  CHECK(*RenderPrompt(r, model::ChatFamily::kQwen3, &slots) ==
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\na"
        "<|im_end|>\n");
  chat->mutable_messages()->RemoveLast();
  chat->clear_add_generation_prompt();
  chat->set_enable_thinking(false);
  CHECK(*RenderPrompt(r, model::ChatFamily::kQwen3, &slots) ==
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  user->set_reasoning_content("not mine");
  CHECK(RenderPrompt(r, model::ChatFamily::kQwen3, &slots).status().message() ==
        "message 0: only assistant messages carry reasoning_content");
}

TEST_CASE("Qwen3-VL videos with timestamps get one run per temporal patch", "[prompt_media]") {
  const std::string video = model::kQwen2VlVideoPlaceholder;
  v1::PrefillRequest r = WithKinds({v1::MEDIA_KIND_IMAGE, v1::MEDIA_KIND_VIDEO});
  r.mutable_images(1)->add_timestamps(0.35);
  r.mutable_images(1)->add_timestamps(1.65);
  auto text = WithVideoTimestamps("a" + video + "b", r);
  REQUIRE(text.ok());
  CHECK(*text ==
        "a<0.3 seconds><|vision_start|><|video_pad|><|vision_end|>"
        "<1.6 seconds><|vision_start|><|video_pad|><|vision_end|>b");
  // Without timestamps (other families) the prompt is untouched.
  CHECK(*WithVideoTimestamps("a" + video, WithKinds({v1::MEDIA_KIND_VIDEO})) == "a" + video);
  // Some videos stamped and some not: refused.
  v1::PrefillRequest mixed = WithKinds({v1::MEDIA_KIND_VIDEO, v1::MEDIA_KIND_VIDEO});
  mixed.mutable_images(0)->add_timestamps(1.0);
  CHECK(WithVideoTimestamps(video + video, mixed).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("an image comes from an encoder or, with its grid, from the prefix cache",
          "[prompt_media]") {
  v1::PromptImage from_encoder;
  from_encoder.set_encoder_id("encoder-0");
  from_encoder.set_encoder_address("127.0.0.1:1");
  CHECK(CheckImageSource(from_encoder, model::MediaKind::kImage).ok());
  v1::PromptImage nowhere;
  nowhere.set_image_index(3);
  const absl::Status none = CheckImageSource(nowhere, model::MediaKind::kImage);
  CHECK(none.code() == absl::StatusCode::kInvalidArgument);
  CHECK(none.message() == "image 3 names no encoder");
  v1::PromptImage cached;
  cached.set_expect_cached(true);
  cached.set_grid_t(1);
  cached.set_grid_h(4);
  cached.set_grid_w(4);
  CHECK(CheckImageSource(cached, model::MediaKind::kImage).ok());
  // Not a video, not without its grid, not with an encoder as well.
  CHECK(CheckImageSource(cached, model::MediaKind::kVideo).code() ==
        absl::StatusCode::kInvalidArgument);
  v1::PromptImage no_grid = cached;
  no_grid.set_grid_w(0);
  CHECK(CheckImageSource(no_grid, model::MediaKind::kImage).code() ==
        absl::StatusCode::kInvalidArgument);
  v1::PromptImage both = cached;
  both.set_encoder_id("encoder-0");
  CHECK(CheckImageSource(both, model::MediaKind::kImage).code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mmserve::language
