// What a client gives an engine (EngineRequest) and what it gets back, one
// StreamEvent per step that produced text or ended the request. Plain values.
#ifndef MMSERVE_WORKER_ENGINE_REQUEST_H_
#define MMSERVE_WORKER_ENGINE_REQUEST_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/hash.h"
#include "model/image_decode.h"
#include "model/image_tokens.h"
#include "model/sampling.h"
#include "scheduler/request.h"
#include "worker/kv_connector.h"

namespace mmserve::worker {

// Why a request ended: the scheduler's enum (one type, no translation).
// kStopString and kHandoff come from the engine only: a text stop string,
// and a prompt handed to a decode engine (KvConnector::OnPromptDone).
using FinishReason = scheduler::FinishReason;

// An image or video (grid.kind) encoded elsewhere (the encoder service): its
// patch grid and its merged-token embeddings, grid.num_tokens() rows of
// hidden_size floats (Qwen3-VL: each row followed by the token's DeepStack
// features, ModelConfig::EmbeddingRowWidth floats a token).
struct MediaEmbedding {
  model::MediaGrid grid;
  std::vector<float> values;
  // Alternatively (values empty) the rows in memory the caller keeps
  // unchanged until the request's final event or its Abort returns (seed
  // 000: the receive buffer the embedding arrived in, shared with the
  // tensor-parallel ranks). Needs `key`.
  const float* shared_values = nullptr;
  // Prefix-cache key of the image's content (e.g. the hash of its encoded
  // bytes); unset: a hash of `values`.
  std::optional<ContentHash> key;
  // Alternatively (no values, no shared_values) no rows at all: an image
  // (not a video) whose KV the engine finds in its prefix cache under `key`
  // at its place in the prompt. The engine keeps those blocks from eviction
  // while the request lives; AddRequest fails FailedPrecondition when they
  // are not cached (LlmEngine::AddRequest).
  bool cached = false;
};

struct EngineRequest {
  std::string id;
  // Prompt text (chat already rendered); each <|image_pad|> is one image and
  // each <|video_pad|> one video (image_embeddings of kind kVideo).
  std::string prompt;
  // Alternatively token ids (prompt must then be empty).
  std::vector<int32_t> prompt_token_ids;
  std::vector<model::RgbImage> images;
  // Alternatively, images and videos already encoded, in order of
  // appearance (images must then be empty).
  std::vector<MediaEmbedding> image_embeddings;
  model::SamplingParams sampling;
  // Scheduling priority: lower is admitted first (scheduler::RequestParams).
  int priority = 0;
  // sampling.max_tokens is a placeholder: generate up to the context length
  // (max_model_len minus the expanded prompt).
  bool max_tokens_to_context = false;
  // A remote prompt only (KvPlan::remote_prompt): the images of
  // prompt_token_ids, which is then the prefill engine's expanded prompt
  // (HandoffPrompt).
  std::vector<HandoffMedia> handoff_images;
  // A request resumed after the instance generating it was lost: the tokens
  // it generated there (and streamed), fewer than max_tokens, none of which
  // ended it. The engine computes them with the prompt and goes on as if it
  // had generated them: the sampler past their draws (one per token unless
  // greedy: the draw of token i depends only on the seed and i), the
  // grammar, text stream, min_tokens, max_tokens and penalties counted
  // from the request's start; events carry only the tokens after them.
  // Decoded here only (no connector plan).
  std::vector<int32_t> resume_output_token_ids;
};

struct StreamEvent {
  std::string request_id;
  std::string text;                           // new text (may be empty)
  std::vector<int32_t> token_ids;             // tokens generated this step
  std::vector<model::SampleResult> logprobs;  // when requested
  FinishReason finish_reason = FinishReason::kNone;
  std::string matched_stop;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_prompt_tokens = 0;
  // kHandoff only: the prompt's KV blocks in prompt order (block ids of
  // kv_cache()). The engine keeps them held under the request's id (a span,
  // as HoldSpan's) until ReleaseSpan(id) or Abort(id): the hand-off reads
  // them meanwhile, while later steps run.
  std::vector<int32_t> kv_blocks;
  // kHandoff only: the prompt as the decode engine must reserve it.
  HandoffPrompt handoff;
  // kAbort that the engine decided itself, when the reason is not the commit
  // deadline: why (e.g. ResourceExhausted for a handed-off image request
  // preempted on the decode side, which cannot recompute its prompt).
  absl::Status error;
};

using StreamCallback = std::function<void(const StreamEvent&)>;

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_ENGINE_REQUEST_H_
