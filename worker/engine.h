// The in-process engine: one model directory served with continuous batching.
// It owns the tokenizer, the Qwen2 language model and (for vision models) the
// vision tower, the KV cache sized from a memory budget after a warm-up
// forward at the largest step (seed 004), the scheduler, and each request's
// sampler and text stream.
//
//   ASSIGN_OR_RETURN(auto engine, LlmEngine::Create(options));
//   EngineRequest req{.id = "r1", .prompt = rendered_chat, .images = {rgb}};
//   RETURN_IF_ERROR(engine->AddRequest(std::move(req), [](const StreamEvent& e) {...}));
//   while (engine->has_unfinished()) RETURN_IF_ERROR(engine->Step());
//
// AddRequest validates everything a client controls (sampling values, prompt
// length against the context, image count against placeholders, decodable
// images) and returns InvalidArgument without side effects. Each Step
// schedules, runs one forward, samples, and calls the stream callbacks of
// the requests that produced text or finished. Not thread-safe: one engine
// thread calls everything (a server posts work to it).
#ifndef MMSERVE_WORKER_ENGINE_H_
#define MMSERVE_WORKER_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/hash.h"
#include "model/cpu/thread_pool.h"
#include "model/image_decode.h"
#include "model/kv_cache.h"
#include "model/model_config.h"
#include "model/qwen2_model.h"
#include "model/qwen2_weights.h"
#include "model/safetensors.h"
#include "model/sampling.h"
#include "model/text_streamer.h"
#include "model/tokenizer.h"
#include "model/vision_tower.h"
#include "scheduler/scheduler.h"
#include "worker/model_runner.h"
#include "worker/tp_group.h"

namespace mmserve::worker {

struct EngineOptions {
  std::string model_dir;
  int block_size = 16;
  int max_num_seqs = 32;
  int max_num_batched_tokens = 1024;
  std::optional<int> max_prefill_tokens;
  bool enable_chunked_prefill = true;
  bool enable_prefix_caching = true;
  // Longest prompt + completion; 0 = the model's max_position_embeddings,
  // capped at 8192.
  int max_model_len = 0;
  // KV cache size. 0: what the engine can use (max_num_seqs sequences of
  // max_model_len tokens), capped by kv_memory_fraction of the memory
  // available after loading and warm-up (MemAvailable in /proc/meminfo).
  // See kv_sizing.h.
  int64_t kv_cache_bytes = 0;
  double kv_memory_fraction = 0.3;
  int num_threads = 0;  // 0: one per core; negative is InvalidArgument
  // Weights quantized at load: "" or "none", "int8" (one scale per output
  // row), "int8_g32" (model::ParseQuantize; anything else is InvalidArgument
  // from Create). Covers the language model and the vision tower's linear
  // layers when it is loaded.
  std::string quantize;
  // Load the vision tower (vision models). A language service whose images
  // arrive as embeddings from an encoder service sets this false and passes
  // EngineRequest::image_embeddings instead of images.
  bool load_vision = true;
  // Tensor parallelism (issue 12): tp_size > 1 makes this engine rank 0 of
  // tp_size rank processes on this host. It starts ranks 1.. from
  // tp_shard_binary (//worker:tp_shard), each with num_threads threads (as
  // rank 0; 0: the cores divided by tp_size), joined by the shared-memory
  // communicator and step ring named
  // tp_instance_id (unique per launch; empty: "engine-<pid>"). Needs
  // num_key_value_heads divisible by tp_size and no quantization.
  // kv_cache_bytes is per rank; with 0, each rank gets kv_memory_fraction of
  // MemAvailable / tp_size.
  int tp_size = 1;
  std::string tp_shard_binary;
  std::string tp_instance_id;
  // More flags for the shard ranks (TpGroupOptions::extra_args).
  std::vector<std::string> tp_shard_args;
  // Seed 000: memory every rank maps (a worker::ShmFile: its descriptor,
  // and where it lies in this process), which must outlive the engine. With
  // tp_size > 1, a step's image rows whose values lie in it reach the other
  // ranks as descriptors (offset, length, content hash); any other rows
  // travel inline in the step. Unset (-1): every row travels inline.
  int shared_input_fd = -1;
  const uint8_t* shared_input = nullptr;
  size_t shared_input_bytes = 0;
};

// An image encoded elsewhere (the encoder service): its patch grid and its
// merged-token embeddings, grid.num_tokens() rows of hidden_size floats.
struct ImageEmbedding {
  model::ImageGrid grid;
  std::vector<float> values;
  // Alternatively (values empty) the rows in memory the caller keeps
  // unchanged until the request's final event or its Abort returns (seed
  // 000: the receive buffer the embedding arrived in, shared with the
  // tensor-parallel ranks). Needs `key`.
  const float* shared_values = nullptr;
  // Prefix-cache key of the image's content (e.g. the hash of its encoded
  // bytes); unset: a hash of `values`.
  std::optional<ContentHash> key;
};

// An image of a prompt that another engine prefilled (role decode,
// ReserveRemoteKv): where its run of image pads starts in the expanded
// prompt, its grid (for the M-RoPE positions of the tokens after it) and its
// prefix-cache key. Its embedding never travels: its KV does.
struct HandoffImage {
  int offset = 0;
  model::ImageGrid grid;  // merge_size: the engine's (set by ReserveRemoteKv)
  ContentHash key;
};

// What a decode engine needs to continue a request that this engine
// prefilled (StreamEvent::handoff): the expanded prompt, its images and the
// M-RoPE delta (decode token n sits at position n + delta).
struct HandoffPrompt {
  std::vector<int32_t> token_ids;
  std::vector<HandoffImage> images;
  int32_t mrope_position_delta = 0;
};

struct EngineRequest {
  std::string id;
  // Prompt text (chat already rendered); each <|image_pad|> is one image.
  std::string prompt;
  // Alternatively token ids (prompt must then be empty).
  std::vector<int32_t> prompt_token_ids;
  std::vector<model::RgbImage> images;
  // Alternatively, images already encoded (images must then be empty).
  std::vector<ImageEmbedding> image_embeddings;
  model::SamplingParams sampling;
  // sampling.max_tokens is a placeholder: generate up to the context length
  // (max_model_len minus the expanded prompt).
  bool max_tokens_to_context = false;
  // Role prefill (issue 12): compute the prompt's KV and sample the first
  // token only. Unless that token already ends the request, its last event
  // has finish_reason kHandoff and carries the prompt's blocks (kv_blocks)
  // for a KV hand-off to a decode engine. Needs tp_size 1.
  bool kv_handoff = false;
  // ReserveRemoteKv only: the images of prompt_token_ids, which is then the
  // prefill engine's expanded prompt (HandoffPrompt).
  std::vector<HandoffImage> handoff_images;
};

// kHandoff: the prompt's KV and first token go to a decode engine, which
// continues the request (EngineRequest::kv_handoff).
enum class FinishReason { kNone, kStop, kLength, kStopString, kAbort, kHandoff };

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
  // kv_cache()). Their contents stay valid until the next Step.
  std::vector<int32_t> kv_blocks;
  // kHandoff only: the prompt as the decode engine must reserve it.
  HandoffPrompt handoff;
  // kAbort that the engine decided itself, when the reason is not the commit
  // deadline: why (e.g. ResourceExhausted for a handed-off image request
  // preempted on the decode side, which cannot recompute its prompt).
  absl::Status error;
};

// A decode engine's blocks for a request whose prompt another engine
// prefills (LlmEngine::ReserveRemoteKv).
struct RemoteKvBlocks {
  // The blocks to write, in prompt order: the prompt's blocks after the first
  // num_cached_tokens / block_size, which this engine's prefix cache holds.
  std::vector<int32_t> blocks;
  int num_cached_tokens = 0;
  // M-RoPE delta of the prompt, from its images (0 for text).
  int32_t mrope_position_delta = 0;
};

using StreamCallback = std::function<void(const StreamEvent&)>;

// Memory and capacity decided at start, for logs and benchmarks.
struct EngineSizing {
  size_t weights_bytes = 0;
  size_t vision_bytes = 0;
  int64_t warmup_rss_growth_bytes = 0;
  size_t kv_bytes = 0;
  int num_kv_blocks = 0;
  int max_model_len = 0;
};

class LlmEngine {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LlmEngine>> Create(
      const EngineOptions& options);
  ~LlmEngine();

  [[nodiscard]] absl::Status AddRequest(EngineRequest request, StreamCallback callback);
  // Aborts a live request; its callback gets a final kAbort event. NotFound
  // for unknown ids.
  [[nodiscard]] absl::Status Abort(const std::string& id);
  // Runs one scheduler step.
  [[nodiscard]] absl::Status Step();

  // Role decode (issue 12). Reserves KV blocks for a request whose prompt
  // another engine prefills: `request` carries the prefill engine's
  // expanded prompt token ids with its handoff_images (HandoffPrompt; no
  // images or embeddings: InvalidArgument) and the request's sampling
  // parameters, validated as AddRequest does (image runs against their
  // grids and offsets too); `callback` gets the request's events from its
  // second token on. A handed-off image request has no embeddings here, so
  // it cannot be recomputed: when the scheduler preempts it, the engine
  // aborts it (kAbort with error ResourceExhausted) instead.
  // ResourceExhausted when the KV pool or max_num_seqs has no room now. With
  // tp_size > 1 the block ids hold on every rank (each rank's cache has the
  // same blocks, of its own heads). The request holds the blocks until
  // CommitRemoteKv, Abort, or the first Step after `commit_by` (a prefill
  // engine that died mid-hand-off): that Step aborts it (final event kAbort)
  // and frees its blocks.
  [[nodiscard]] absl::StatusOr<RemoteKvBlocks> ReserveRemoteKv(
      EngineRequest request, StreamCallback callback, Deadline commit_by = Deadline::Never());
  // Reservations still waiting for CommitRemoteKv.
  size_t num_pending_commits() const { return commit_deadlines_.size(); }
  // The reserved blocks hold the prompt's KV (written and verified by the
  // caller): the request decodes on from `first_token`, which the prefill
  // engine sampled (and streamed). Its sampler and text stream continue as
  // if this engine had sampled it. When that token ends the request, its
  // final event (no tokens) comes from here. NotFound for an unknown id,
  // FailedPrecondition when it waits for no KV, InvalidArgument for a token
  // outside the vocabulary.
  [[nodiscard]] absl::Status CommitRemoteKv(const std::string& id, int32_t first_token);

  // The KV storage (rank 0's with tensor parallelism), for KV hand-off.
  model::KvCache& kv_cache() { return *kv_; }
  // The other ranks (tp_size > 1; else null): their step ring and
  // communicator, for KV hand-off steps from the engine's thread.
  TpGroup* tp_group() const { return tp_group_.get(); }

  bool has_unfinished() const { return !requests_.empty(); }
  const model::Tokenizer& tokenizer() const { return *tokenizer_; }
  const model::ModelConfig& config() const { return config_; }
  const EngineSizing& sizing() const { return sizing_; }
  const scheduler::Scheduler& scheduler() const { return *scheduler_; }
  // Seed 000: seconds this engine's steps spent handing image rows to the
  // other ranks (ModelRunner::embedding_handoff_seconds), in total; 0 with
  // tp_size 1.
  double embedding_handoff_seconds() const {
    return runner_ != nullptr ? runner_->embedding_handoff_seconds() : 0;
  }
  // Image rows those steps named by descriptor (in shared_input) and
  // carried inline, in total.
  int64_t embedding_rows_by_descriptor() const {
    return runner_ != nullptr ? runner_->rows_by_descriptor() : 0;
  }
  int64_t embedding_rows_inline() const { return runner_ != nullptr ? runner_->rows_inline() : 0; }

 private:
  struct Live;
  LlmEngine() = default;
  absl::Status Load(const EngineOptions& options);
  absl::Status SizeKvCache(const EngineOptions& options);
  absl::Status PrepareImages(EngineRequest& request, Live& live, std::vector<int32_t>* ids);
  // ReserveRemoteKv's images: spans of the already expanded `ids`.
  absl::Status PrepareHandoffImages(EngineRequest& request, Live& live,
                                    const std::vector<int32_t>& ids);
  // Step after Schedule: the forward, sampling and the stream events.
  absl::Status StepScheduled(const scheduler::SchedulerOutput& out);
  // AddRequest's validation and set-up, shared with ReserveRemoteKv.
  absl::StatusOr<std::unique_ptr<Live>> Prepare(EngineRequest& request, StreamCallback callback,
                                                scheduler::RequestParams* params);
  void Finish(Live& live, FinishReason reason, StreamEvent& event);

  model::ModelConfig config_;
  std::unique_ptr<model::Tokenizer> tokenizer_;
  std::unique_ptr<model::SafetensorsCheckpoint> checkpoint_;
  std::unique_ptr<model::Qwen2Weights> weights_;
  std::unique_ptr<model::VisionTower> vision_;
  std::unique_ptr<TpGroup> tp_group_;  // tp_size > 1
  std::unique_ptr<model::cpu::ThreadPool> pool_;
  std::unique_ptr<model::Qwen2Model> model_;
  std::unique_ptr<model::KvCache> kv_;
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  EngineSizing sizing_;
  std::vector<int32_t> eos_ids_;
  int32_t image_pad_id_ = -1;
  uint64_t next_id_ = 1;
  absl::flat_hash_map<std::string, std::unique_ptr<Live>> requests_;
  absl::flat_hash_map<uint64_t, Live*> by_scheduler_id_;
  // ReserveRemoteKv requests not yet committed, by request id.
  absl::flat_hash_map<std::string, Deadline> commit_deadlines_;
};

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_ENGINE_H_
