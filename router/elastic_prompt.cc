#include "router/elastic_prompt.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/chat_proto.h"
#include "model/chat_template.h"
#include "model/qwen3vl_video.h"

namespace mmserve::router {
namespace {

// The text the language side tokenizes (language_service/prompt_media.h
// renders the same chat the same way).
absl::StatusOr<std::string> PromptText(const RouterOptions& options,
                                       const mmserve::v1::GenerateRequest& request) {
  if (!request.has_chat()) return request.raw().text();
  std::vector<model::ChatMessage> messages;
  model::ChatOptions opts;
  model::ChatFromProto(request.chat(), &messages, &opts);
  ASSIGN_OR_RETURN(model::ChatFamily family, model::ChatFamilyFor(options.config.model_type));
  return model::RenderChat(family, messages, opts);
}

}  // namespace

absl::StatusOr<ElasticLength> ElasticRequestLength(const RouterOptions& options,
                                                   const model::Tokenizer* tokenizer,
                                                   const mmserve::v1::GenerateRequest& request,
                                                   const std::vector<PreparedMedia>& images) {
  ElasticLength n;
  if (request.has_raw() && request.raw().token_ids_size() > 0) {
    n.prompt_tokens = request.raw().token_ids_size();
  } else {
    if (tokenizer == nullptr) {
      return absl::FailedPreconditionError("the elastic manager needs the model's tokenizer");
    }
    ASSIGN_OR_RETURN(std::string text, PromptText(options, request));
    // Qwen3-VL videos: the language side writes each temporal patch's
    // timestamp text (language_service/prompt_media.h).
    std::vector<model::Qwen3VideoPrompt> videos;
    for (const PreparedMedia& m : images) {
      if (!m.timestamps.empty()) videos.push_back({m.timestamps, 1});
    }
    if (!videos.empty()) {
      ASSIGN_OR_RETURN(text, model::ExpandQwen3VideoPrompt(text, videos));
    }
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(text));
    n.prompt_tokens = static_cast<int64_t>(ids.size());
  }
  for (const PreparedMedia& image : images) {
    if (!image.grid) {
      return absl::FailedPreconditionError("the elastic manager needs images pre-sized");
    }
    // Each pad expands: one per image, one per temporal patch of a
    // timestamped video.
    const int64_t pads = image.timestamps.empty() ? 1 : image.grid->grid_t;
    n.prompt_tokens += image.grid->num_tokens() - pads;
  }
  const int64_t context = options.max_model_len;
  const mmserve::v1::SamplingParams& s = request.sampling();
  n.max_tokens = s.has_max_tokens() ? int64_t{s.max_tokens()} : context - n.prompt_tokens;
  if (n.max_tokens < 1 || n.prompt_tokens + n.max_tokens > context) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt (", n.prompt_tokens,
                                                   " tokens) and max_tokens exceed the context (",
                                                   context, " tokens)"));
  }
  return n;
}

}  // namespace mmserve::router
