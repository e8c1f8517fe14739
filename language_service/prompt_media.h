// The prompt of a PrefillRequest and its multimodal slots: the chat rendered
// with the model's template (image and video parts become one placeholder
// each) or the raw text, the kind of each placeholder in order, and the
// check that the request's PromptImage list (images and videos in one index
// space, order of appearance) describes exactly those placeholders.
//
//   std::vector<model::MediaKind> slots;
//   ASSIGN_OR_RETURN(std::string prompt, RenderPrompt(request, &slots));
//   RETURN_IF_ERROR(CheckPromptMedia(slots, request));
//
// Pure functions; thread-safe.
#ifndef MMSERVE_LANGUAGE_SERVICE_PROMPT_MEDIA_H_
#define MMSERVE_LANGUAGE_SERVICE_PROMPT_MEDIA_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/chat_template.h"
#include "model/image_tokens.h"
#include "proto/language.pb.h"

namespace mmserve::language {

namespace v1 = ::mmserve::internal::v1;

// The prompt text; `slots` gets the kind of each image or video placeholder
// in order. InvalidArgument for a request without a prompt or a chat the
// template refuses.
[[nodiscard]] absl::StatusOr<std::string> RenderPrompt(const v1::PrefillRequest& request,
                                                       model::ChatFamily family,
                                                       std::vector<model::MediaKind>* slots);

// InvalidArgument unless request.images() has one entry per slot, each of
// the slot's kind (an image part described as a video, or the reverse, is
// refused).
[[nodiscard]] absl::Status CheckPromptMedia(absl::Span<const model::MediaKind> slots,
                                            const v1::PrefillRequest& request);

// Where `image` (in a slot of kind `slot`) comes from: an encoder (its id
// and address), or this instance's prefix cache (expect_cached: an image
// slot, its grid given, no encoder). InvalidArgument naming the image
// otherwise.
[[nodiscard]] absl::Status CheckImageSource(const v1::PromptImage& image, model::MediaKind slot);

// Qwen3-VL: the prompt with each video's placeholder replaced by its
// temporal patches, each after its "<t seconds>" text and with one
// <|video_pad|> (model/qwen3vl_video.h; the engine expands the pads), when
// the request's videos carry timestamps; `prompt` unchanged when none does.
// InvalidArgument when only some do, or the placeholders and videos differ.
[[nodiscard]] absl::StatusOr<std::string> WithVideoTimestamps(std::string prompt,
                                                              const v1::PrefillRequest& request);

// InvalidArgument for a value outside the enum (a newer peer's kind).
[[nodiscard]] absl::StatusOr<model::MediaKind> MediaKindFromProto(int kind);
v1::MediaKind MediaKindToProto(model::MediaKind kind);

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_PROMPT_MEDIA_H_
