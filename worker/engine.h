// The in-process engine: one model directory served with continuous batching
// (after nano-vllm's LLMEngine: add a request; step = schedule, run, emit).
// It owns what LoadEngineModel loaded (tokenizer, model, vision tower, KV
// cache sized after a warm-up), the scheduler, the model runner,
// each request's sampler and text stream, and an optional KvConnector (the
// role: none for `both`, kv_connector.h for prefill and decode).
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
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "grammar/grammar.h"
#include "model/kv_cache.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "scheduler/scheduler.h"
#include "worker/engine_elastic.h"
#include "worker/engine_load.h"
#include "worker/engine_options.h"
#include "worker/engine_request.h"
#include "worker/kv_connector.h"
#include "worker/model_runner.h"
#include "worker/request_grammar.h"
#include "worker/request_prep.h"
#include "worker/tp_group.h"

namespace mmserve::worker {

class MediaAdmission;

class LlmEngine {
 public:
  // `connector` is the role: null for `both` (every prompt computed here,
  // every request decoded here), PrefillKvConnector, DecodeKvConnector.
  // Its Attach error fails Create.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LlmEngine>> Create(
      const EngineOptions& options, std::unique_ptr<KvConnector> connector = nullptr);
  ~LlmEngine();

  // Adds a request; the connector's PlanRequest decides where its prompt's
  // KV comes from. A remote prompt (role decode) carries the prefill
  // engine's expanded token ids with its handoff_images (HandoffPrompt; no
  // text, images or embeddings: InvalidArgument) and is validated as any
  // other (image runs against their grids and offsets too); the engine
  // reserves its blocks into `*remote_kv` (required then) and `callback`
  // gets its events from its second token on. ResourceExhausted when the KV
  // pool or max_num_seqs has no room now. With tp_size > 1 the block ids
  // hold on every rank (each rank's cache has the same blocks, of its own
  // heads). It holds the blocks until CommitRemoteKv, Abort, or the Step
  // after the connector's commit deadline, which aborts it (final event
  // kAbort) and frees them. handoff_images on a local prompt: InvalidArgument.
  // Images without rows (MediaEmbedding::cached): their prompt's blocks
  // through the last of them must be in the prefix cache, else
  // FailedPrecondition (nothing changes); they stay pinned until the
  // request ends.
  [[nodiscard]] absl::Status AddRequest(EngineRequest request, StreamCallback callback,
                                        RemoteKvBlocks* remote_kv = nullptr);
  // Aborts a live request (final event kAbort); NotFound for unknown ids.
  [[nodiscard]] absl::Status Abort(const std::string& id);
  // Runs one scheduler step.
  [[nodiscard]] absl::Status Step();

  // Role elastic: a span of `tokens` of request `id`'s KV kept for a group
  // prefill while another instance decodes it (kHoldingSpan: never
  // scheduled, no unfinished work); its block ids in order. Abort(id) or
  // ReleaseSpan(id) frees it. AlreadyExists when `id` is live here or holds
  // a span, ResourceExhausted when the pool has no room.
  [[nodiscard]] absl::StatusOr<std::vector<kvpool::BlockId>> HoldSpan(const std::string& id,
                                                                      int tokens);
  // NotFound when `id` holds no span.
  [[nodiscard]] absl::Status ReleaseSpan(const std::string& id);
  // Role elastic: `request` prepared as AddRequest would, never queued
  // (engine_elastic.h); its errors are AddRequest's, but the prompt and its
  // max_tokens may reach the model's context (sizing().context_len), past
  // what this engine's KV pool holds. Unimplemented with tp_size > 1.
  [[nodiscard]] absl::StatusOr<std::unique_ptr<ElasticRequest>> PrepareElastic(
      EngineRequest request);
  // Role elastic: the group's first token of `request` through the engine's
  // sampling (SampleNext, as the runner samples) and emit path (Emit's
  // TokenEvent): sampled here from first.logits (the group's sampler), or
  // first.token taken as sampled here (the random stream advances one draw
  // per non-greedy sample), so the master goes on with the same stream. The
  // event carries the token, its text and log-probabilities when sampled
  // here (none when taken), and the finish reason when the token ends the
  // request (eos, a stop id or string, max_tokens, a complete constrained
  // output). InvalidArgument when the grammar refuses the token or a taken
  // token is outside the vocabulary; FailedPrecondition when the request
  // has its first token already.
  [[nodiscard]] absl::StatusOr<StreamEvent> FirstElasticToken(ElasticRequest& request,
                                                              const ElasticFirstToken& first);
  // Role elastic: request `request`, whose span this engine holds under its
  // id (HoldSpan, its tokens from span.kv_begin on), decodes here from
  // `state` on: a request of the batch (the scheduler's kMastering) whose
  // rows the MasterPeers complete with the other members' spans; it emits
  // through `callback` as any request. Tokens of `state` past those the
  // request generated here are replayed (no text: streamed elsewhere) and
  // the random stream is the state's seed at its draws. NotFound when no
  // span of its id is held; InvalidArgument when the state does not
  // continue the request (another M-RoPE delta, no token, a token out of
  // the vocabulary, more draws than tokens, tokens not beginning with its
  // own, a replayed token that ends it) or its span has no room for its
  // next token. On error the span stays held (the caller ends the request).
  [[nodiscard]] absl::Status StartMastering(std::unique_ptr<ElasticRequest> request,
                                            const ElasticRequest::MasterState& state,
                                            const MasterSpan& span, StreamCallback callback);
  // The request mastered here stops (no event): its span stays held (as
  // HoldSpan's) and its state goes to the next master. NotFound unless
  // `id` is mastered here.
  [[nodiscard]] absl::StatusOr<ElasticRequest::MasterState> StopMastering(const std::string& id);
  bool MasterSpanFull(const std::string& id) const;  // no slot for its next token
  // Scheduler::GrowSpan for `id`; refused with no slot left, `id` ends RESOURCE_EXHAUSTED.
  absl::StatusOr<std::vector<kvpool::BlockId>> GrowMasterSpan(const std::string& id, int64_t end);
  // The span holders of the requests mastered here (outlive the steps;
  // null: their steps fail).
  void set_master_peers(MasterPeers* peers) { master_peers_ = peers; }
  // For an elastic group's prefill on the engine's thread (ForwardElasticPrefill).
  model::Qwen2Model& model() { return *m_->model; }
  size_t num_held_spans() const { return scheduler_->num_held_spans(); }

  // The reserved blocks of a remote prompt hold its KV (written and verified
  // by the caller): the request decodes on from `first_token`, which the
  // prefill engine sampled (and streamed). Its sampler and text stream
  // continue as if this engine had sampled it. When that token ends the
  // request, its final event (no tokens) comes from here. NotFound for an
  // unknown id, FailedPrecondition when it waits for no KV, InvalidArgument
  // for a token outside the vocabulary.
  [[nodiscard]] absl::Status CommitRemoteKv(const std::string& id, int32_t first_token);
  // Remote prompts still waiting for CommitRemoteKv.
  size_t num_pending_commits() const { return scheduler_->num_waiting_for_kv(); }

  // The KV storage (rank 0's with tensor parallelism), for KV hand-off.
  model::KvCache& kv_cache() { return *m_->kv; }
  // The other ranks' step ring and communicator (null with tp_size 1).
  TpGroup* tp_group() const { return m_->tp_group.get(); }

  // Requests to run (held spans are not).
  bool has_unfinished() const { return requests_.size() > num_held_spans(); }
  const model::Tokenizer& tokenizer() const { return *m_->tokenizer; }
  const model::ModelConfig& config() const { return m_->config; }
  const EngineSizing& sizing() const { return m_->sizing; }
  const scheduler::Scheduler& scheduler() const { return *scheduler_; }
  // Seconds this engine's steps spent handing image rows to the other ranks
  // (ModelRunner::embedding_handoff_seconds); 0 with tp_size 1.
  double embedding_handoff_seconds() const { return runner_->embedding_handoff_seconds(); }
  // Image rows those steps named by descriptor (shared_input) and inline.
  int64_t embedding_rows_by_descriptor() const { return runner_->rows_by_descriptor(); }
  int64_t embedding_rows_inline() const { return runner_->rows_inline(); }
  // Seconds computing structured-output masks (helper thread) and waiting for them.
  double grammar_mask_seconds() const { return runner_->grammar_mask_seconds(); }
  double grammar_mask_wait_seconds() const { return runner_->grammar_mask_wait_seconds(); }

 private:
  struct Live;
  // A request's sampled token of this step, with what the step decided.
  struct Sampled;
  LlmEngine() = default;

  // engine.cc: adding, aborting, committing, finishing.
  // AddRequest's validation and set-up (request_prep.h's functions).
  absl::StatusOr<std::unique_ptr<Live>> Prepare(EngineRequest& request, StreamCallback callback,
                                                const KvPlan& plan,
                                                scheduler::RequestParams* params,
                                                const PromptRules& rules);
  // sampling.constraint compiled against this model's vocabulary (the
  // grammars cached by content); InvalidArgument with the reason.
  absl::StatusOr<std::unique_ptr<RequestGrammar>> CompileGrammar(
      const grammar::ConstraintSpec& spec);
  absl::Status Reserve(std::unique_ptr<Live> live, scheduler::RequestParams params,
                       const KvRequestInfo& info, RemoteKvBlocks* remote_kv);
  void Finish(Live& live, FinishReason reason, StreamEvent& event);

  // engine_step.cc: after Schedule, the forward, sampling and the events.
  absl::Status StepScheduled(const scheduler::SchedulerOutput& out);
  // The event of one sampled token; ends the request when it finished.
  absl::Status Emit(Sampled& s);
  // The requests mastered here among out's entries (batch order) and the
  // peers for them; *status says why they cannot run this step.
  model::SpanAttentionPeers* PeersFor(const scheduler::SchedulerOutput& out, absl::Status* status);
  // Requests the connector would not have recomputed, aborted after a step.
  absl::Status AbortUnrecomputable(
      const std::vector<std::pair<std::string, absl::Status>>& victims);

  std::unique_ptr<EngineModel> m_;
  PromptRules rules_;
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  std::unique_ptr<MediaAdmission> media_;  // the images' rows (engine_media.h)
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<KvConnector> connector_;  // null: role both
  MasterPeers* master_peers_ = nullptr;     // role elastic
  // The structured-output grammars, from the first constrained request on.
  std::unique_ptr<grammar::GrammarCache> grammars_;
  uint64_t next_id_ = 1;
  absl::flat_hash_map<std::string, std::unique_ptr<Live>> requests_;
  absl::flat_hash_map<uint64_t, Live*> by_scheduler_id_;
};

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_ENGINE_H_
