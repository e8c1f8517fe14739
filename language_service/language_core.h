// The language instance's work (role both): requests in, tokens out, with
// image embeddings arriving over UCX from encoder services.
//
//   ASSIGN_OR_RETURN(auto core, LanguageCore::Create(options, transfer_engine, registry));
//   RETURN_IF_ERROR(core->Submit(prefill_request, {.on_batch = ..., .on_end = ...}));
//
// One loop thread owns the engine (scheduler, KV cache, model) and every
// request's state (common/event_loop's MessageLoop); everything else posts
// typed messages to it (language_core_request.h), handled in one place. A request whose
// embeddings are still in flight waits outside the engine: the loop never
// blocks on a transfer (the asynchronous hand-off's principle inside one process) and keeps
// stepping the requests that are ready. Per image: connect to its encoder
// (once per encoder, on the connector thread), receive its embedding (exact
// allocation when the router pre-sized it, else default-then-resume), derive
// its grid from the M-RoPE section, free the blocks. When an image's source
// fails (lost peer, deadline, corrupt data), the request reports the lost
// images in its stream (TokenBatch.lost_images) and waits up to
// `lost_image_timeout` for Retry with new sources. Sinks run on the loop
// thread and must not block. Thread-safe.
//
// Roles prefill and decode (text and image prompts; prefill tp_size
// 1, decode any tp_size, each decode rank receiving only its own KV heads): a
// decode core registers a request (RegisterDecode, the Decode stream),
// reserves its KV blocks (AllocateKv with the expanded prompt, its image
// spans and M-RoPE delta; held until CommitKv or kv_commit_timeout) and, once the
// prefill side has written them over UCX, checks their CRC32C and decodes on
// (CommitKv). A prefill core runs a Submit'ed request up to its first token
// and then, on the loop thread while the prompt's blocks are still valid,
// calls AllocateKv on the decode instance the request names, puts the blocks
// (transfer/kv_handoff), calls CommitKv and ends the stream with
// kv_handed_off. The hand-off blocks the loop for its duration (bounded by
// kv_handoff_timeout): the smallest correct form, not the overlapped one.
#ifndef MMSERVE_LANGUAGE_SERVICE_LANGUAGE_CORE_H_
#define MMSERVE_LANGUAGE_SERVICE_LANGUAGE_CORE_H_

#include <array>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "common/metrics.h"
#include "language_service/esp_groups.h"
#include "language_service/role.h"
#include "proto/language.grpc.pb.h"
#include "proto/language.pb.h"
#include "proto/registry.pb.h"
#include "transfer/transfer_engine.h"
#include "worker/engine.h"

namespace mmserve::language {

// Seed 000: how an arrived image embedding reaches the model (and, with
// tensor parallelism, every rank).
enum class MmHandoff {
  // Read in place: the request keeps the receive-buffer blocks the
  // embedding arrived in until it ends, and a step names its rows by offset
  // (the buffer is memory every rank maps: engine.shared_input). Images that
  // arrived in several chunks are copied as kBlocking does.
  kAsync,
  // Copied: the loop copies each embedding out of the receive buffer when
  // it arrives and rank 0 copies its rows into every step that uses them
  // (the baseline mm_handoff_bench measures against).
  kBlocking,
};

struct LanguageCoreOptions {
  std::string instance_id;
  // The role and its KV hand-off (role.h).
  RoleOptions role;
  worker::EngineOptions engine;
  MmHandoff mm_handoff = MmHandoff::kAsync;
  // One image's transfer, from init to its last chunk.
  absl::Duration transfer_timeout = absl::Seconds(30);
  // How long a request with lost images waits for the router's retry.
  absl::Duration lost_image_timeout = absl::Seconds(10);
  // The encoder Connect call.
  absl::Duration connect_timeout = absl::Seconds(3);
  // Role elastic: its ESP groups (esp_groups.h; name and profile are set
  // from instance_id and role.kv_profile).
  EspGroupsOptions esp;
  // Called once, from the loop thread, when the instance is out of service
  // for good (a tensor-parallel rank died): main stops the process as on
  // SIGTERM, and its supervisor restarts it. Unset: only logged.
  std::function<void(const absl::Status&)> on_fatal;
};

// The engine's finish reason as the API says it (the one translation; kNone
// and kHandoff are no finish: FINISH_REASON_UNSPECIFIED).
mmserve::v1::FinishReason FinishReasonToProto(worker::FinishReason reason);

// A request's outputs, called on the loop thread. on_batch for every batch
// (tokens, or lost images); on_end exactly once: OK after the batch that
// carried finish_reason, or the error that ended the request.
struct RequestSink {
  std::function<void(v1::TokenBatch)> on_batch;
  std::function<void(absl::Status)> on_end;
};

// A request's phases and the events that move it (language_core_request.h).
enum class RequestPhase : uint8_t;
enum class RequestEvent : uint8_t;

class LanguageCore {
 public:
  // `transfer` and `metrics` must outlive the core.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LanguageCore>> Create(
      const LanguageCoreOptions& options, transfer::TransferEngine& transfer,
      metrics::Registry& metrics);
  ~LanguageCore();
  LanguageCore(const LanguageCore&) = delete;
  LanguageCore& operator=(const LanguageCore&) = delete;

  // Checks what can be checked at once (chat, image parts against `images`,
  // sampling, a duplicate id) and queues the request; on error nothing was
  // queued and the sink is never called.
  [[nodiscard]] absl::Status Submit(const v1::PrefillRequest& request, RequestSink sink);
  // Role decode: opens a request whose KV a prefill instance will hand over;
  // `sink` gets an empty batch once the request is held (AllocateKv may come
  // from then on), then its tokens from the second one on. Checks as Submit
  // does.
  [[nodiscard]] absl::Status RegisterDecode(const v1::DecodeRequest& request, RequestSink sink);
  // Role decode: reserves the blocks of a registered request.
  // FailedPrecondition when it is not registered or already reserved,
  // ResourceExhausted when there is no room now, InvalidArgument for image
  // spans that disagree with the token ids (the request stays registered)
  // or an M-RoPE delta that disagrees with them (the request ends).
  [[nodiscard]] absl::StatusOr<v1::KvAllocation> AllocateKv(const v1::KvAllocateRequest& request);
  // Role decode: the reserved blocks hold the KV; DataLoss (and the request
  // ends) when their CRC32C differs from the commit's, InvalidArgument (and
  // the request ends) when its M-RoPE delta differs from the allocation's.
  [[nodiscard]] absl::Status CommitKv(const v1::KvCommit& commit);

  // Role elastic: keeps a span of `tokens` of request `id`'s KV
  // here for a group prefill (LlmEngine::HoldSpan): its block ids. Abort(id)
  // frees it. FailedPrecondition on other roles, AlreadyExists and
  // ResourceExhausted as the engine's, Unavailable when shutting down.
  [[nodiscard]] absl::StatusOr<std::vector<int32_t>> HoldSpan(const std::string& id, int tokens);

  // Role elastic: member `request.member` of a group prefill
  // (esp_groups.h). Checks as Submit does, waits for the request's images
  // like it, then runs the member's part on the loop thread. The stream:
  // the sampler's carries the first token (with finish_reason when that
  // token ends the request); the master's the tokens after it, to the
  // finish; every other member's ends OK, empty, once its span is kept (or
  // freed, when it keeps none). Unimplemented on other roles.
  [[nodiscard]] absl::Status EspPrefill(const v1::EspPrefillRequest& request, RequestSink sink);
  // Role elastic: the request's next master (this instance, waiting in its
  // EspPrefill) takes over from the previous one's state (its stream's
  // TokenBatch.esp_moved) and streams the tokens after it. NotFound when no
  // such request waits here to master; InvalidArgument when the state does
  // not continue its decode range (the request ends); Unimplemented on
  // other roles.
  [[nodiscard]] absl::Status EspMoveMaster(const v1::EspMoveRequest& request);
  // Role elastic: InstanceInfo.esp_endpoint (empty on other roles).
  std::string esp_endpoint() const { return esp_ == nullptr ? "" : esp_->endpoint(); }
  // Spans held here for other masters' decodes (role elastic).
  size_t num_esp_spans() const;

  // Ends the request with CANCELLED (its sink's on_end) and frees everything
  // it holds, here and at its encoders; a held span is freed. Unknown ids
  // are ignored.
  void Abort(const std::string& request_id, const std::string& reason);
  // New sources for images of a request (lost ones, or ones the router
  // moved). A retry for a request not seen yet is kept for
  // lost_image_timeout and applied when it arrives. Always true.
  bool Retry(const v1::ImageRetry& retry);
  // Ends every request with UNAVAILABLE and stops the loop. Idempotent.
  void Shutdown();

  v1::LoadReport Load() const;
  v1::Capacity Capacity() const;
  const model::ModelConfig& config() const { return engine_->config(); }
  // Live requests (waiting for images or in the engine).
  size_t num_requests() const;

 private:
  struct Request;
  struct Connection;
  struct Message;

  LanguageCore(const LanguageCoreOptions& options, transfer::TransferEngine& transfer,
               metrics::Registry& metrics);
  // Queues `message` for the loop thread; false once stopping.
  bool Post(Message message);
  // The loop thread's one entry for messages, and its step hook: lost-image
  // deadlines, a lost rank, an engine step, the load report.
  void Handle(Message& message);
  Deadline StepHook();
  // Claims `r`'s id (AlreadyExists while a request of that id lives;
  // Unavailable when stopping), then on the loop thread keeps `r` in
  // requests_ (OnInstall).
  absl::Status Install(std::unique_ptr<Request> r);
  // Submit's checks and the request they build, not yet installed.
  absl::StatusOr<std::unique_ptr<Request>> MakeRequest(const v1::PrefillRequest& request,
                                                       RequestSink sink);
  // Role elastic: a group member's request whose images are here runs its
  // part (language_core_esp.cc).
  void AdmitEsp(Request& r);
  // Role elastic, from the step hook: the idle lease and one decode step of
  // each request mastered here; whether any is decoding.
  bool StepEsp();
  // AllocateKv on the loop thread.
  absl::StatusOr<v1::KvAllocation> ReserveKv(const v1::KvAllocateRequest& request);
  // CommitKv on the loop thread.
  absl::Status CommitReservedKv(const v1::KvCommit& commit);
  // HoldSpan and EspMoveMaster on the loop thread (language_core_esp.cc).
  void HandleEsp(Message& message);
  absl::StatusOr<std::vector<int32_t>> HoldSpanHere(const std::string& id, int tokens);
  absl::Status MoveMasterHere(const v1::EspMoveRequest& request);
  // A master's decode range is full: its stream's last batch hands the
  // state on and ends OK (its KV stays held as a span).
  void OnMasterMoved(const std::string& id, const worker::EspRequest::MasterState& state);
  // The one place a request's phase changes (language_core_request.h).
  void Advance(Request& r, RequestEvent event);
  // The hand-off's metrics (constructor only).
  void RegisterHandOffMetrics(metrics::Registry& metrics);
  // Role prefill: the prompt's KV goes to the decode instance; the stream's
  // last batch says so (language_core_kv.cc).
  void OnHandedOff(Request& r, const worker::StreamEvent& e, v1::TokenBatch b);
  // The batch and usage of a finished request's final event.
  void FillFinal(Request& r, const worker::StreamEvent& e, double now, v1::TokenBatch& b);
  // An engine step and its metrics; ends every request in the engine when
  // it fails.
  void StepEngine();
  // A tensor-parallel rank died: ends every request in the engine with
  // `why` and tells main (options_.on_fatal) once.
  void LoseRank(const absl::Status& why);
  // The connector thread: connects to an encoder, then tells the loop.
  void Connect(const std::string& encoder, const std::string& address);
  // Role both and prefill: a new request starts its images; role decode: a
  // registered one says it is held.
  void OnInstall(std::unique_ptr<Request> r);
  void OnAbort(const std::string& id, const std::string& reason);
  void OnShutDown();
  // Loop thread only, from here on.
  void StartImage(Request& r, size_t k);
  void StartReceive(Request& r, size_t k);
  void OnConnected(const std::string& encoder, const std::string& address, absl::Status status);
  void OnImage(const std::string& id, size_t k, const std::string& transfer_id,
               absl::StatusOr<transfer::ReceivedImage> image);
  void LoseImages(Request& r, const std::string& transfer_id, const absl::Status& why);
  void ApplyRetry(Request& r, const v1::ImageRetry& retry);
  void MaybeAdmit(Request& r);
  void OnEvent(const worker::StreamEvent& e);
  v1::TokenBatch Batch(const Request& r, const worker::StreamEvent& e) const;
  // Ends every request the engine holds with `why`.
  void EndInEngine(const absl::Status& why);
  void End(const std::string& id, absl::Status status);
  void CheckLostDeadlines();
  void UpdateLoad();

  const LanguageCoreOptions options_;
  bool lost_rank_reported_ = false;  // loop thread only
  transfer::TransferEngine& transfer_;
  std::unique_ptr<worker::LlmEngine> engine_;
  // What the role changes (role.h); declared after the engine, whose KV
  // cache it registers, so it goes first.
  std::unique_ptr<Role> role_;
  // Role elastic; after the engine, whose model and KV cache it uses.
  std::unique_ptr<EspGroups> esp_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Ids known to the loop (Submit refuses duplicates; Retry answers known).
  std::map<std::string, bool> ids_ ABSL_GUARDED_BY(mu_);
  // Retries that arrived before their request, oldest first, with expiry.
  std::deque<std::pair<v1::ImageRetry, Deadline>> early_retries_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex load_mu_;
  v1::LoadReport load_ ABSL_GUARDED_BY(load_mu_);

  // Loop thread only.
  std::map<std::string, std::unique_ptr<Request>> requests_;
  std::map<std::string, std::unique_ptr<Connection>> connections_;

  metrics::Counter* resumes_;
  metrics::Counter* transfer_bytes_;
  metrics::Counter* lost_images_;
  metrics::Counter* images_received_;
  metrics::Histogram* transfer_seconds_;
  metrics::Histogram* ttft_seconds_;
  metrics::Histogram* itl_seconds_;
  metrics::Histogram* e2e_seconds_;
  metrics::Histogram* step_seconds_;
  metrics::Histogram* embedding_round_trips_;
  metrics::Histogram* kv_handoff_round_trips_;
  std::array<metrics::Counter*, 3> kv_handoffs_{};  // by transfer::KvHandoffPath
  metrics::Counter* handoff_blocked_seconds_;
  double engine_handoff_seconds_ = 0;  // loop thread: what the counter has of the engine's
  metrics::Counter* rows_by_descriptor_;
  metrics::Counter* rows_inline_;
  int64_t engine_rows_by_descriptor_ = 0;  // loop thread, as engine_handoff_seconds_
  int64_t engine_rows_inline_ = 0;
  metrics::Counter* grammar_mask_seconds_;
  metrics::Counter* grammar_mask_wait_seconds_;
  double engine_mask_seconds_ = 0;  // loop thread, as engine_handoff_seconds_
  double engine_mask_wait_seconds_ = 0;
  double step_time_us_ = 0;  // loop thread: moving average of a step, for the load report
  uint32_t last_batch_ = 0;  // loop thread: requests in the last step

  bool shut_down_ = false;  // loop thread: ShutDown was handled

  // Last: their threads stop before anything they use goes.
  std::unique_ptr<EventLoop> connector_;  // encoder Connect calls, one at a time
  std::unique_ptr<MessageLoop<Message>> loop_;
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_LANGUAGE_CORE_H_
