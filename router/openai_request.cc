// ParseChatCompletionRequest: the request half of router/openai.h.
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "router/data_url.h"
#include "router/media_url.h"
#include "router/openai.h"
#include "router/openai_fields.h"
#include "router/openai_tools.h"
#include "router/tool_request.h"

namespace mmserve::router {
namespace {

using json = nlohmann::json;
using mmserve::v1::ChatMessage;
using mmserve::v1::ContentPart;
using mmserve::v1::SamplingParams;
using openai_fields::FieldError;
using openai_fields::Find;
using openai_fields::GetBool;
using openai_fields::GetInteger;
using openai_fields::GetNumber;
using openai_fields::GetString;
using openai_fields::kUint32Max;

// Fields accepted only at the value that changes nothing.
absl::Status CheckNeutralFields(const json& body) {
  for (const char* key : {"use_beam_search", "echo"}) {
    if (const json* v = Find(body, key)) {
      ASSIGN_OR_RETURN(bool on, GetBool(*v, key));
      if (on) return FieldError(key, "is not supported");
    }
  }
  // The deprecated forms of tools and tool_choice.
  if (const json* v = Find(body, "functions")) {
    if (!v->is_array()) return FieldError("functions", "must be an array");
    if (!v->empty()) return FieldError("functions", "is not supported; use \"tools\"");
  }
  if (const json* v = Find(body, "function_call")) {
    if (!(v->is_string() && (*v == "none" || *v == "auto"))) {
      return FieldError("function_call", "is not supported; use \"tool_choice\"");
    }
  }
  if (const json* v = Find(body, "modalities")) {
    if (!v->is_array()) return FieldError("modalities", "must be an array");
    for (const json& m : *v) {
      if (m != "text") return FieldError("modalities", "only \"text\" output is supported");
    }
  }
  for (const char* key : {"audio", "prediction"}) {
    if (Find(body, key) != nullptr) return FieldError(key, "is not supported");
  }
  return absl::OkStatus();
}

// The data: URL of an image_url or video_url part (`key`), of media type
// `kind`/..., at most max_bytes decoded; or, for an http(s) URL, that URL in
// *remote (checked for form only: the router fetches it, if it fetches
// remote media at all, after parsing).
absl::StatusOr<DataUrl> ParsePartUrl(const json& part, const std::string& field,
                                     absl::string_view key, absl::string_view kind,
                                     size_t max_bytes, const json** object, std::string* remote) {
  const json* media_url = Find(part, std::string(key).c_str());
  if (media_url == nullptr) {
    return FieldError(field, absl::StrCat(key, " part without \"", key, "\""));
  }
  std::string url_field = absl::StrCat(field, ".", key);
  const json* url = media_url;
  *object = nullptr;
  if (media_url->is_object()) {
    *object = media_url;
    url_field += ".url";
    url = Find(*media_url, "url");
    if (url == nullptr) return FieldError(url_field, "missing");
  }
  ASSIGN_OR_RETURN(std::string text, GetString(*url, url_field));
  if (IsRemoteMediaUrl(text)) {
    if (absl::Status s = ParseMediaUrl(text).status(); !s.ok()) {
      return FieldError(url_field, s.message());
    }
    *remote = std::move(text);
    return DataUrl();
  }
  absl::StatusOr<DataUrl> data = ParseDataUrl(text, max_bytes);
  if (!data.ok()) return FieldError(url_field, data.status().message());
  if (!absl::StartsWith(data->mime_type, absl::StrCat(kind, "/"))) {
    return FieldError(url_field, absl::StrCat("media type \"", data->mime_type, "\" is not ",
                                              kind == "image" ? "an " : "a ", kind, " (data:", kind,
                                              "/...;base64,...)"));
  }
  if (data->data.empty()) return FieldError(url_field, absl::StrCat("empty ", kind));
  return data;
}

// An Image or Video message's bytes and media type from a data: URL, or
// its remote URL.
template <typename Media>
Media* SetMedia(DataUrl data, std::string remote, Media* media) {
  if (!remote.empty()) {
    media->set_url(std::move(remote));
    return media;
  }
  media->set_data(std::move(data.data));
  media->set_mime_type(std::move(data.mime_type));
  return media;
}

absl::Status ParseImagePart(const json& part, const std::string& field, const OpenAiLimits& limits,
                            ContentPart* out) {
  const json* object = nullptr;
  std::string remote;
  ASSIGN_OR_RETURN(DataUrl data, ParsePartUrl(part, field, "image_url", "image",
                                              limits.max_image_bytes, &object, &remote));
  SetMedia(std::move(data), std::move(remote), out->mutable_image());
  return absl::OkStatus();
}

// A video_url part: {"url": "data:video/mp4;base64,..."} (or an http(s)
// URL) and, an mmserve
// extension, the sampling options of mmserve.v1.Video ("fps", "max_frames",
// "min_frames", "min_pixels", "max_pixels").
absl::Status ParseVideoPart(const json& part, const std::string& field, const OpenAiLimits& limits,
                            ContentPart* out) {
  const json* object = nullptr;
  std::string remote;
  ASSIGN_OR_RETURN(DataUrl data, ParsePartUrl(part, field, "video_url", "video",
                                              limits.max_video_bytes, &object, &remote));
  mmserve::v1::Video* video = SetMedia(std::move(data), std::move(remote), out->mutable_video());
  if (object == nullptr) return absl::OkStatus();
  const std::string f = field + ".video_url.";
  if (const json* v = Find(*object, "fps")) {
    ASSIGN_OR_RETURN(double fps, GetNumber(*v, f + "fps"));
    if (fps <= 0) return FieldError(f + "fps", "must be positive");
    video->set_fps(fps);
  }
  using Setter = void (mmserve::v1::Video::*)(uint32_t);
  for (const auto& [name, set] :
       {std::pair<const char*, Setter>{"max_frames", &mmserve::v1::Video::set_max_frames},
        {"min_frames", &mmserve::v1::Video::set_min_frames},
        {"min_pixels", &mmserve::v1::Video::set_min_pixels},
        {"max_pixels", &mmserve::v1::Video::set_max_pixels}}) {
    if (const json* v = Find(*object, name)) {
      ASSIGN_OR_RETURN(int64_t n, GetInteger(*v, f + name, 1, kUint32Max));
      (video->*set)(static_cast<uint32_t>(n));
    }
  }
  return absl::OkStatus();
}

// vLLM's chat_template_kwargs: the template options mmserve's formats have
// (enable_thinking).
absl::Status ParseChatTemplateKwargs(const json& body, mmserve::v1::Chat* chat) {
  const json* kwargs = Find(body, "chat_template_kwargs");
  if (kwargs == nullptr) return absl::OkStatus();
  if (!kwargs->is_object()) return FieldError("chat_template_kwargs", "must be an object");
  for (const auto& [key, value] : kwargs->items()) {
    const std::string field = "chat_template_kwargs." + key;
    if (key != "enable_thinking") return FieldError(field, "is not supported (enable_thinking)");
    ASSIGN_OR_RETURN(bool on, GetBool(value, field));
    chat->set_enable_thinking(on);
  }
  return absl::OkStatus();
}

absl::Status ParseMessage(const json& m, const std::string& field, const OpenAiLimits& limits,
                          int* images, ChatMessage* out) {
  if (!m.is_object()) return FieldError(field, "must be an object");
  const json* role_json = Find(m, "role");
  if (role_json == nullptr) return FieldError(field + ".role", "missing");
  ASSIGN_OR_RETURN(std::string role, GetString(*role_json, field + ".role"));
  if (role == "developer") role = "system";  // OpenAI's newer name for system
  if (role == "function") {
    return FieldError(field + ".role", "role \"function\" is not supported; use \"tool\"");
  }
  if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
    return FieldError(field + ".role", absl::StrCat("unknown role \"", role,
                                                    "\" (system, user, assistant or tool)"));
  }
  out->set_role(role);
  RETURN_IF_ERROR(openai_tools::ParseMessageToolFields(m, field, role, out));
  if (const json* r = Find(m, "reasoning_content")) {
    if (role != "assistant") {
      return FieldError(field + ".reasoning_content", "only assistant messages carry it");
    }
    ASSIGN_OR_RETURN(*out->mutable_reasoning_content(),
                     GetString(*r, field + ".reasoning_content"));
  }

  const std::string content_field = field + ".content";
  const json* content = Find(m, "content");
  if (content == nullptr) {
    // An assistant turn may be empty; anyone else must say something.
    if (role == "assistant") return absl::OkStatus();
    return FieldError(content_field, "missing");
  }
  if (content->is_string()) {
    out->add_content()->set_text(content->get<std::string>());
    return absl::OkStatus();
  }
  if (!content->is_array()) {
    return FieldError(content_field, "must be a string or a list of content parts");
  }
  for (size_t j = 0; j < content->size(); ++j) {
    const json& part = (*content)[j];
    std::string part_field = absl::StrCat(content_field, "[", j, "]");
    if (!part.is_object()) return FieldError(part_field, "must be an object");
    const json* type_json = Find(part, "type");
    if (type_json == nullptr) return FieldError(part_field + ".type", "missing");
    ASSIGN_OR_RETURN(std::string type, GetString(*type_json, part_field + ".type"));
    if (type == "text") {
      const json* text = Find(part, "text");
      if (text == nullptr) return FieldError(part_field + ".text", "missing");
      ASSIGN_OR_RETURN(std::string s, GetString(*text, part_field + ".text"));
      out->add_content()->set_text(std::move(s));
    } else if (type == "image_url" || type == "video_url") {
      const bool video = type == "video_url";
      if (role == "assistant") {
        return FieldError(part_field, absl::StrCat("assistant messages may not hold ",
                                                   video ? "videos" : "images"));
      }
      if (++*images > limits.max_images) {
        return FieldError(part_field, absl::StrCat(video ? "too many images and videos: at most "
                                                         : "too many images: at most ",
                                                   limits.max_images, " per request"));
      }
      ContentPart* part_out = out->add_content();
      RETURN_IF_ERROR(video ? ParseVideoPart(part, part_field, limits, part_out)
                            : ParseImagePart(part, part_field, limits, part_out));
    } else {
      return FieldError(part_field + ".type",
                        absl::StrCat("content part type \"", type,
                                     "\" is not supported (text, image_url or video_url)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseLogprobs(const json& body, SamplingParams* s) {
  bool logprobs = false;
  if (const json* v = Find(body, "logprobs")) {
    ASSIGN_OR_RETURN(logprobs, GetBool(*v, "logprobs"));
  }
  int64_t top_logprobs = 0;
  if (const json* v = Find(body, "top_logprobs")) {
    ASSIGN_OR_RETURN(top_logprobs, GetInteger(*v, "top_logprobs", 0, kUint32Max));
    if (top_logprobs > 0 && !logprobs) {
      return FieldError("top_logprobs", "requires \"logprobs\": true");
    }
  }
  if (logprobs) s->set_logprobs(static_cast<uint32_t>(top_logprobs));
  return absl::OkStatus();
}

absl::Status ParseSampling(const json& body, SamplingParams* s) {
  RETURN_IF_ERROR(openai_fields::ParseSamplerParams(body, s));
  RETURN_IF_ERROR(openai_fields::ParsePenalties(body, s));
  RETURN_IF_ERROR(openai_fields::ParseStopping(body, s));
  return ParseLogprobs(body, s);
}

}  // namespace

absl::StatusOr<OpenAiChatRequest> ParseChatCompletionRequest(absl::string_view json_body,
                                                             const OpenAiLimits& limits) {
  ASSIGN_OR_RETURN(json body, openai_fields::ParseBody(json_body, limits.max_body_bytes));

  OpenAiChatRequest out;
  mmserve::v1::GenerateRequest& request = out.request;
  if (const json* v = Find(body, "model")) {
    ASSIGN_OR_RETURN(out.model, GetString(*v, "model"));
    request.set_model(out.model);
  }
  RETURN_IF_ERROR(openai_fields::ParseStreamFlags(body, &out.stream, &out.include_usage));
  request.mutable_stream()->set_include_usage(true);
  RETURN_IF_ERROR(CheckNeutralFields(body));
  RETURN_IF_ERROR(openai_fields::ParseChoices(body, &request));

  const json* messages = Find(body, "messages");
  if (messages == nullptr) return FieldError("messages", "missing");
  if (!messages->is_array()) return FieldError("messages", "must be a list of messages");
  if (messages->empty()) return FieldError("messages", "must not be empty");
  mmserve::v1::Chat* chat = request.mutable_chat();
  int images = 0;
  for (size_t i = 0; i < messages->size(); ++i) {
    RETURN_IF_ERROR(ParseMessage((*messages)[i], absl::StrCat("messages[", i, "]"), limits, &images,
                                 chat->add_messages()));
  }
  if (const json* v = Find(body, "add_generation_prompt")) {
    ASSIGN_OR_RETURN(bool b, GetBool(*v, "add_generation_prompt"));
    chat->set_add_generation_prompt(b);
  }
  RETURN_IF_ERROR(ParseChatTemplateKwargs(body, chat));
  RETURN_IF_ERROR(openai_tools::ParseTools(body, json_body, chat));
  RETURN_IF_ERROR(ValidateToolUse(*chat, ToolFieldNames::kOpenAi));
  RETURN_IF_ERROR(ParseSampling(body, request.mutable_sampling()));
  RETURN_IF_ERROR(openai_fields::ParseConstraint(body, json_body, request.mutable_sampling()));
  // vLLM's extension: lower runs first among waiting requests.
  if (const json* v = Find(body, "priority")) {
    ASSIGN_OR_RETURN(int64_t priority, GetInteger(*v, "priority", INT32_MIN, INT32_MAX));
    request.set_priority(static_cast<int32_t>(priority));
  }
  return out;
}

}  // namespace mmserve::router
