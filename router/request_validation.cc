#include "router/request_validation.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/chat_template.h"
#include "model/image_decode.h"
#include "model/image_preprocess.h"
#include "model/sampling_proto.h"
#include "router/input_limits.h"
#include "router/request_media.h"
#include "router/tool_request.h"

namespace mmserve::router {
namespace {

absl::Status Invalid(absl::string_view why) { return absl::InvalidArgumentError(why); }

}  // namespace

std::vector<const mmserve::v1::Image*> RequestImages(const mmserve::v1::GenerateRequest& r) {
  std::vector<const mmserve::v1::Image*> out;
  if (r.has_chat()) {
    for (const auto& m : r.chat().messages()) {
      for (const auto& p : m.content()) {
        if (p.has_image()) out.push_back(&p.image());
      }
    }
  } else if (r.has_raw()) {
    for (const auto& im : r.raw().images()) out.push_back(&im);
  }
  return out;
}

absl::Status ValidateRequest(const RouterOptions& options,
                             const mmserve::v1::GenerateRequest& request) {
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return Invalid(absl::StrCat("request_id is longer than ", kMaxRequestIdBytes, " bytes"));
  }
  if (!request.model().empty() && request.model() != options.model_id) {
    return Invalid(absl::StrCat("unknown model \"", request.model(), "\"; this server serves \"",
                                options.model_id, "\""));
  }
  RETURN_IF_ERROR(CheckPromptBytes(options, request));
  if (request.has_chat()) {
    if (request.chat().messages().empty()) return Invalid("chat.messages is empty");
    for (int i = 0; i < request.chat().messages_size(); ++i) {
      const auto& m = request.chat().messages(i);
      if (m.role() != "system" && m.role() != "user" && m.role() != "assistant" &&
          m.role() != "tool") {
        return Invalid(absl::StrCat("chat.messages[", i, "].role \"", m.role(),
                                    "\" is not system, user, assistant or tool"));
      }
      for (const auto& p : m.content()) {
        if (p.has_image() && m.role() != "user") {
          return Invalid(absl::StrCat("chat.messages[", i, "]: only user messages hold images"));
        }
        if (p.part_case() == mmserve::v1::ContentPart::PART_NOT_SET) {
          return Invalid(absl::StrCat("chat.messages[", i, "] has an empty content part"));
        }
      }
    }
    RETURN_IF_ERROR(ValidateToolUse(request.chat(), ToolFieldNames::kProto));
  } else if (request.has_raw()) {
    const auto& raw = request.raw();
    if (raw.token_ids_size() > 0 && (!raw.text().empty() || raw.images_size() > 0)) {
      return Invalid("raw: give text (with images) or token_ids, not both");
    }
    if (raw.token_ids_size() == 0 && raw.text().empty()) return Invalid("raw.text is empty");
    for (uint32_t id : raw.token_ids()) {
      if (id >= static_cast<uint32_t>(options.config.text.vocab_size)) {
        return Invalid(absl::StrCat("raw.token_ids: ", id, " is outside the vocabulary"));
      }
    }
    int placeholders = 0;
    for (size_t at = raw.text().find(model::kQwen2VlImagePlaceholder); at != std::string::npos;
         at = raw.text().find(model::kQwen2VlImagePlaceholder, at + 1)) {
      ++placeholders;
    }
    if (placeholders != raw.images_size()) {
      return Invalid(absl::StrCat("raw.text has ", placeholders, " image placeholders but ",
                                  raw.images_size(), " images were sent"));
    }
  } else {
    return Invalid("the request has no input: set chat or raw");
  }
  const auto images = RequestImages(request);
  if (static_cast<int>(images.size()) > options.max_images) {
    return Invalid(
        absl::StrCat(images.size(), " images; at most ", options.max_images, " per request"));
  }
  if (!images.empty() && !options.config.vision) {
    return Invalid("this model does not accept images");
  }
  for (size_t k = 0; k < images.size(); ++k) {
    if (images[k]->source_case() == mmserve::v1::Image::kUrl) {
      // The front ends fetch URLs before validation when remote media is on.
      return Invalid(absl::StrCat("image ", k, " is a URL, which this server does not fetch"));
    }
    const std::string& data = images[k]->data();
    if (data.empty()) return Invalid(absl::StrCat("image ", k, " is empty"));
    if (data.size() > options.max_image_bytes) {
      return Invalid(absl::StrCat("image ", k, " has ", data.size(), " bytes; at most ",
                                  options.max_image_bytes));
    }
  }
  RETURN_IF_ERROR(ValidateVideos(options, request));
  bool to_context = false;
  RETURN_IF_ERROR(model::SamplingFromProto(request.sampling(), options.config,
                                           options.max_model_len, &to_context)
                      .status());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PreparedMedia>> PrepareRequest(
    const RouterOptions& options, const mmserve::v1::GenerateRequest& request) {
  RETURN_IF_ERROR(ValidateRequest(options, request));
  const std::vector<MediaPart> media = RequestMedia(request);
  std::vector<PreparedMedia> out(media.size());
  for (size_t k = 0; k < media.size(); ++k) {
    if (media[k].video != nullptr) {
      ASSIGN_OR_RETURN(out[k], PrepareVideo(options, *media[k].video, k));
      continue;
    }
    const std::string& data = media[k].image->data();
    out[k].hash = HashBytes(data);
    if (!options.presize) continue;
    // The exact token count from the header, with the encoder's smart resize.
    absl::StatusOr<model::ImageHeader> h = model::ReadImageHeader(data);
    if (!h.ok()) return Invalid(absl::StrCat("image ", k, ": ", h.status().message()));
    if (static_cast<int64_t>(h->width) * h->height > options.max_image_pixels) {
      return Invalid(absl::StrCat("image ", k, " is ", h->width, "x", h->height,
                                  " pixels; at most ", options.max_image_pixels, " pixels"));
    }
    absl::StatusOr<model::MediaGrid> g =
        model::SmartResize(h->width, h->height, model::GridParamsFor(*options.config.preprocessor));
    if (!g.ok()) return Invalid(absl::StrCat("image ", k, ": ", g.status().message()));
    out[k].grid = *g;
  }
  return out;
}

}  // namespace mmserve::router
