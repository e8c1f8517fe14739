// Request preparation as pure functions (no model, no engine state): the
// prompt's token checks, image expansion with M-RoPE positions, hand-off
// image placement, max_tokens against the context, the scheduler's
// parameters and the prompt a decode engine continues from.
//
//   PromptRules rules = ...;  // from the model's config
//   RETURN_IF_ERROR(CheckTokenIds(ids, rules.vocab_size));
//   ASSIGN_OR_RETURN(PreparedPrompt prompt, ExpandImages(ids, image_rows, rules));
//   ASSIGN_OR_RETURN(int max_tokens, ResolveMaxTokens(sampling, false,
//                                                     prompt.token_ids.size(), rules));
//   scheduler::RequestParams p = SchedulerParams(id, prompt, sampling, max_tokens, rules);
//
// Every function is thread-safe; rows are borrowed, never copied.
#ifndef MMSERVE_WORKER_REQUEST_PREP_H_
#define MMSERVE_WORKER_REQUEST_PREP_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/hash.h"
#include "model/image_tokens.h"
#include "model/mrope_positions.h"
#include "model/sampling.h"
#include "scheduler/request.h"
#include "worker/engine_request.h"
#include "worker/kv_connector.h"

namespace mmserve::worker {

// What preparation needs to know about the model.
struct PromptRules {
  model::MediaPadIds pads() const { return {.image = image_pad_id, .video = video_pad_id}; }

  // Floats per image token: the embedding, then Qwen3-VL's DeepStack features.
  int image_row_width() const { return hidden_size * (1 + deepstack_levels); }

  int vocab_size = 0;
  int hidden_size = 0;
  int deepstack_levels = 0;  // ModelConfig::DeepstackLevels
  int32_t image_pad_id = -1;
  int32_t video_pad_id = -1;    // -1: no video token (videos refused)
  bool accepts_images = false;  // the model has a vision config (images and videos)
  // Qwen3-VL: each temporal patch of a video is a run of its own (after its
  // timestamp), with the M-RoPE positions of a one-patch video.
  bool video_frames_apart = false;
  int merge_size = 2;  // the vision config's spatial_merge_size
  int max_model_len = 0;
  std::vector<int32_t> eos_ids;  // the first is the scheduler's eos
};

// One image's or video's embedding (grid.kind says which):
// grid.num_tokens() rows of PromptRules::image_row_width() floats.
struct MediaRows {
  model::MediaGrid grid;
  absl::Span<const float> rows;
  std::optional<ContentHash> key;  // unset: a hash of the rows
};

// An image placed in the expanded prompt.
struct PreparedMedia {
  int offset = 0;  // its first token
  int length = 0;  // its tokens (grid.num_tokens())
  model::MediaGrid grid;
  const float* rows = nullptr;  // null: a handed-off image (its KV is written remotely)
  ContentHash key;              // prefix-cache key (MultimodalSpan::content_hash)
  // For the tensor-parallel ranks' descriptors: key.low when the key came
  // with the image, 0 when it is a hash of the rows.
  uint64_t rank_hash = 0;
};

struct PreparedPrompt {
  std::vector<int32_t> token_ids;  // with each image's run of pads
  model::MropePositions positions;
  std::vector<PreparedMedia> images;  // prompt order
};

// InvalidArgument for an empty prompt or an id outside [0, vocab_size).
[[nodiscard]] absl::Status CheckTokenIds(absl::Span<const int32_t> ids, int vocab_size);

// InvalidArgument unless the embedding holds its grid's rows (values of
// grid.num_tokens() * row_width floats, or shared_values with a key and no
// values) or is an image expected cached (a grid and a key, no rows).
[[nodiscard]] absl::Status CheckImageEmbedding(const MediaEmbedding& e, int row_width);

// Each video of grid_t temporal patches as grid_t one-patch videos (their
// rows in order, each key distinct); images and one-patch videos as they are.
std::vector<MediaRows> SplitVideoRows(absl::Span<const MediaRows> media, int row_width);

// Expands the k-th image or video pad of `ids` into images[k]'s run (images
// and videos in order of appearance; grid.kind picks the pad; with
// video_frames_apart, a pad per temporal patch: SplitVideoRows) and computes
// the M-RoPE positions. InvalidArgument when pads and images disagree.
[[nodiscard]] absl::StatusOr<PreparedPrompt> ExpandImages(absl::Span<const int32_t> ids,
                                                          absl::Span<const MediaRows> images,
                                                          const PromptRules& rules);

// `ids` is another engine's expanded prompt (HandoffPrompt::token_ids):
// checks that each image's (or video's, by grid.kind) run of pads lies where
// it says (in order, inside the prompt, grids multiples of merge_size, no
// pads outside them) and computes the positions. The images get no rows. InvalidArgument otherwise.
[[nodiscard]] absl::StatusOr<PreparedPrompt> PlaceHandoffImages(
    absl::Span<const int32_t> ids, absl::Span<const HandoffMedia> images, const PromptRules& rules);

// The request's max_tokens: sampling.max_tokens, or what the context leaves
// (to_context). InvalidArgument when the prompt and max_tokens exceed
// max_model_len, or the context leaves fewer than max(1, min_tokens).
[[nodiscard]] absl::StatusOr<int> ResolveMaxTokens(const model::SamplingParams& sampling,
                                                   bool to_context, size_t prompt_tokens,
                                                   const PromptRules& rules);

// The scheduler's view: the prompt, its image spans, limits, stop ids and
// eos (the first eos id; the others are stop ids unless ignore_eos).
scheduler::RequestParams SchedulerParams(scheduler::RequestId id, const PreparedPrompt& prompt,
                                         const model::SamplingParams& sampling, int max_tokens,
                                         const PromptRules& rules);

// What a decode engine reserves to continue this prompt.
HandoffPrompt MakeHandoffPrompt(const PreparedPrompt& prompt);

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_REQUEST_PREP_H_
