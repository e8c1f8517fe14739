// Prefill/decode disaggregation as a connector the engine calls (after vLLM's
// KVConnectorBase_V1): the engine asks it where a request's prompt KV comes
// from and tells it when a prompt is done, when remote KV is committed, when
// a request is preempted and when it leaves. A role is a connector chosen at
// start; role `both` uses none, and the engine and the scheduler hold no
// role branches.
//
//   auto connector = std::make_unique<DecodeKvConnector>(
//       DecodeKvConnector::Options{.commit_timeout = absl::Seconds(10)});
//   ASSIGN_OR_RETURN(auto engine, LlmEngine::Create(options, std::move(connector)));
//   RemoteKvBlocks blocks;  // the prefill instance writes the prompt's KV here
//   RETURN_IF_ERROR(engine->AddRequest(std::move(request), callback, &blocks));
//   ...
//   RETURN_IF_ERROR(engine->CommitRemoteKv(id, first_token));
//
// Hooks, in the order a request meets them (the engine's thread, never
// during a forward; one engine per connector):
//   Attach          once, at LlmEngine::Create
//   PlanRequest     AddRequest, before validation: local or remote prompt,
//                   whether the request stops after its prompt
//   OnReserved      a remote prompt's blocks are reserved (kWaitingForKv)
//   OnCommitted     CommitRemoteKv: the reserved blocks hold the prompt's KV
//   TakeExpired     each Step, first: reservations to abort
//   OnPreempted     the scheduler preempted a request: keep (recompute) or
//                   abort with a status
//   OnPromptQueued  a prompt-only request is queued (AddRequest): its
//                   expanded prompt, so a hand-off can start before it runs
//   OnLayersWritten during the forward that computes a prompt-only
//                   request's last prompt rows, after each decoder layer
//                   (only when WantsLayers): those layers' KV is final
//   OnPromptDone    a prompt-only request sampled its first token: hand it
//                   off (final event kHandoff) or let it finish here
//   OnFinished      the request left the engine (any final event)
// Not thread-safe: the engine's thread calls every hook (OnLayersWritten
// from inside the forward, so it must be cheap).
#ifndef MMSERVE_WORKER_KV_CONNECTOR_H_
#define MMSERVE_WORKER_KV_CONNECTOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/hash.h"
#include "model/image_tokens.h"
#include "scheduler/request.h"

namespace mmserve::worker {

// An image of a prompt that another engine prefilled (a remote prompt):
// where its run of image pads starts in the expanded prompt, its grid (for
// the M-RoPE positions of the tokens after it) and its prefix-cache key. Its
// embedding never travels: its KV does.
struct HandoffMedia {
  int offset = 0;
  model::MediaGrid grid;  // merge_size: the engine's (set by AddRequest)
  ContentHash key;
};

// What a decode engine needs to continue a request that this engine
// prefilled (StreamEvent::handoff): the expanded prompt, its images and the
// M-RoPE delta (decode token n sits at position n + delta).
struct HandoffPrompt {
  std::vector<int32_t> token_ids;
  std::vector<HandoffMedia> images;
  int32_t mrope_position_delta = 0;
};

// A decode engine's blocks for a request whose prompt another engine
// prefills (AddRequest with a remote prompt).
struct RemoteKvBlocks {
  // The blocks to write, in prompt order: the prompt's blocks after the first
  // num_cached_tokens / block_size, which this engine's prefix cache holds.
  std::vector<int32_t> blocks;
  int num_cached_tokens = 0;
  // M-RoPE delta of the prompt, from its images (0 for text).
  int32_t mrope_position_delta = 0;
};

// The engine, as a connector sees it at Attach.
struct KvConnectorContext {
  int tp_size = 1;
};

// A request as PlanRequest sees it (before the engine validates it).
struct KvRequestInfo {
  absl::string_view id;
  int num_handoff_images = 0;  // EngineRequest::handoff_images
};

// Where a request's prompt KV comes from and where the request ends.
struct KvPlan {
  // Another engine writes the prompt's KV: AddRequest reserves blocks for it
  // (kWaitingForKv) and it decodes from CommitRemoteKv on. Such a request
  // carries the other engine's expanded token ids and handoff_images (no
  // text, no images).
  bool remote_prompt = false;
  // The request samples only its first token here (the scheduler's
  // max_tokens is 1); OnPromptDone then decides where it goes on.
  bool prompt_only = false;
};

// A prompt-only request's first token is out and its prompt's KV is in
// `blocks` (block ids of the engine's kv_cache(), prompt order; when it is
// handed off they stay held until LlmEngine::ReleaseSpan of its id).
struct KvPromptDone {
  absl::string_view id;
  int32_t first_token = 0;
  // Why the scheduler finished it: kStop (stop token, eos) or kLength (the
  // one-token limit, or a max_tokens of 1).
  scheduler::FinishReason reason = scheduler::FinishReason::kNone;
  int max_tokens = 0;  // what the client asked for
  const std::vector<int32_t>* blocks = nullptr;
  const HandoffPrompt* prompt = nullptr;
};

// The prompt-only requests whose last prompt rows a forward computes, and
// how many decoder layers of it are done: their KV of layers
// [0, layers_written) is final.
struct KvLayersWritten {
  struct Prompt {
    std::string id;
    std::vector<int32_t> blocks;  // block ids of the engine's kv_cache(), prompt order
  };
  const std::vector<Prompt>* prompts = nullptr;
  int layers_written = 0;
  int num_layers = 0;
};

class KvConnector {
 public:
  virtual ~KvConnector() = default;

  // LlmEngine::Create: an error fails Create (e.g. a role that needs
  // tp_size 1).
  [[nodiscard]] virtual absl::Status Attach(const KvConnectorContext& context) = 0;
  virtual KvPlan PlanRequest(const KvRequestInfo& request) = 0;
  // A remote prompt's reservation is made; it must be committed before the
  // connector's deadline (TakeExpired).
  virtual void OnReserved(absl::string_view id, const KvRequestInfo& request) = 0;
  virtual void OnCommitted(absl::string_view id) = 0;
  // Reservations whose commit did not come in time: the engine aborts each
  // (final event kAbort, blocks freed).
  virtual std::vector<std::string> TakeExpired() = 0;
  // OK: the request is recomputed later (the scheduler's preemption);
  // otherwise the engine aborts it after the step with this status as the
  // final event's error.
  [[nodiscard]] virtual absl::Status OnPreempted(absl::string_view id) = 0;
  // True: the request ends here with kHandoff, its event carrying `blocks`
  // and `prompt`, and its blocks stay held under its id (a span) until the
  // hand-off is over (LlmEngine::ReleaseSpan or Abort); false: it finishes
  // with `reason` and its blocks are freed.
  virtual bool OnPromptDone(const KvPromptDone& done) = 0;
  virtual void OnFinished(absl::string_view id) = 0;
  // The layer-wise hooks; by default none.
  virtual void OnPromptQueued(absl::string_view id, const HandoffPrompt& prompt) {}
  virtual bool WantsLayers() const { return false; }
  virtual void OnLayersWritten(const KvLayersWritten& written) {}
};

// Role prefill: every request is prompt-only and, unless its first token
// ends it (stop token, eos, max_tokens 1), is handed off, whatever the
// tp_size (a tensor-parallel prefill role hands off each rank's heads). A
// role that streams the KV while the prompt computes extends it with the
// layer-wise hooks.
class PrefillKvConnector : public KvConnector {
 public:
  absl::Status Attach(const KvConnectorContext&) override { return absl::OkStatus(); }
  KvPlan PlanRequest(const KvRequestInfo&) override { return {.prompt_only = true}; }
  void OnReserved(absl::string_view, const KvRequestInfo&) override {}
  void OnCommitted(absl::string_view) override {}
  std::vector<std::string> TakeExpired() override { return {}; }
  absl::Status OnPreempted(absl::string_view) override { return absl::OkStatus(); }
  bool OnPromptDone(const KvPromptDone& done) override;
  void OnFinished(absl::string_view) override {}
};

// Role decode: every request's prompt is remote. A reservation not committed
// within commit_timeout is aborted (a prefill engine that died mid-hand-off).
// A handed-off image request has no embeddings here, so it cannot be
// recomputed: when preempted it is aborted with ResourceExhausted.
class DecodeKvConnector final : public KvConnector {
 public:
  struct Options {
    absl::Duration commit_timeout = absl::InfiniteDuration();
  };
  DecodeKvConnector() : DecodeKvConnector(Options{}) {}
  explicit DecodeKvConnector(Options options) : options_(options) {}

  absl::Status Attach(const KvConnectorContext&) override { return absl::OkStatus(); }
  KvPlan PlanRequest(const KvRequestInfo&) override { return {.remote_prompt = true}; }
  void OnReserved(absl::string_view id, const KvRequestInfo& request) override;
  void OnCommitted(absl::string_view id) override { commit_by_.erase(id); }
  std::vector<std::string> TakeExpired() override;
  absl::Status OnPreempted(absl::string_view id) override;
  bool OnPromptDone(const KvPromptDone&) override { return false; }
  void OnFinished(absl::string_view id) override;

 private:
  const Options options_;
  // Reservations waiting for their commit, by request id.
  absl::flat_hash_map<std::string, Deadline> commit_by_;
  // Live requests whose prompt has images (not recomputable here).
  absl::flat_hash_set<std::string> has_images_;
};

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_KV_CONNECTOR_H_
