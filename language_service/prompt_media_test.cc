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

}  // namespace
}  // namespace mmserve::language
