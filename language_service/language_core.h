// The language instance's work: requests in, tokens out, with image
// embeddings arriving over UCX from encoder services.
//
//   ASSIGN_OR_RETURN(auto core, LanguageCore::Create(options, transfer_engine, registry));
//   RETURN_IF_ERROR(core->Submit(prefill_request, {.on_batch = ..., .on_end = ...}));
//
// One loop thread owns the engine (scheduler, KV cache, model) and every
// request's state (common/event_loop's MessageLoop); everything else posts
// typed messages to it (language_core_request.h), handled in one place. The
// core is the loop, the dispatch of those messages to its parts and the
// engine glue (admission, the engine's events, the step hook, the load
// report). Its parts:
//   RequestTable     the live ids, the records and their phases (request_table.h);
//   MediaGather      a request's images from its encoders (media_gather.h): a
//                    request waits outside the engine until they arrive, and
//                    the loop never blocks on a transfer;
//   LanguageMetrics  every metric handle, made once (language_metrics.h);
//   Role             what the role changes (role.h), through hooks on this
//                    one path; its own calls reach the loop through RoleHost,
//                    which the core implements. The core never asks which
//                    role it runs.
// Sinks run on the loop thread and must not block. Thread-safe.
#ifndef MMSERVE_LANGUAGE_SERVICE_LANGUAGE_CORE_H_
#define MMSERVE_LANGUAGE_SERVICE_LANGUAGE_CORE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "common/metrics.h"
#include "language_service/elastic_groups.h"
#include "language_service/language_metrics.h"
#include "language_service/media_gather.h"
#include "language_service/prefix_digest.h"
#include "language_service/request_table.h"
#include "language_service/role.h"
#include "language_service/role_host.h"
#include "proto/language.grpc.pb.h"
#include "proto/language.pb.h"
#include "proto/registry.pb.h"
#include "transfer/transfer_engine.h"
#include "worker/engine.h"

namespace mmserve::language {

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
  // Role elastic: its elastic groups (elastic_groups.h; name and profile are set
  // from instance_id and role.kv_profile).
  ElasticGroupsOptions elastic;
  // Called once, from the loop thread, when the instance is out of service
  // for good (a tensor-parallel rank died): main stops the process as on
  // SIGTERM, and its supervisor restarts it. Unset: only logged.
  std::function<void(const absl::Status&)> on_fatal;
};

// The engine's finish reason as the API says it (the one translation; kNone
// and kHandoff are no finish: FINISH_REASON_UNSPECIFIED).
mmserve::v1::FinishReason FinishReasonToProto(worker::FinishReason reason);

class LanguageCore final : private RoleHost {
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
  // The role's own calls (DecodeCalls, ElasticCalls) and what the
  // registration says of it.
  Role& role() { return *role_; }
  const Role& role() const { return *role_; }

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
  struct Message;

  LanguageCore(const LanguageCoreOptions& options, transfer::TransferEngine& transfer,
               metrics::Registry& metrics);
  // Queues `message` for the loop thread; false once stopping.
  bool Post(Message message);
  // The loop thread's one entry for messages, and its step hook: lost-image
  // deadlines, a lost rank, an engine step, the role's step, the load
  // report.
  void Handle(Message& message);
  Deadline StepHook();

  // RoleHost: what the role reaches.
  bool RunOnLoop(absl::AnyInvocable<void(bool shutting_down)> task) override;
  // Submit's checks and the request they build, not yet installed.
  absl::StatusOr<std::unique_ptr<LiveRequest>> MakeRequest(const v1::PrefillRequest& request,
                                                           RequestSink sink) override;
  // Claims `r`'s id (AlreadyExists while a request of that id lives;
  // Unavailable when stopping), then on the loop thread keeps `r` in
  // requests_ (OnInstall).
  absl::Status Install(std::unique_ptr<LiveRequest> r) override;
  LiveRequest* Find(const std::string& id) override { return requests_.Find(id); }
  void End(const std::string& id, absl::Status status) override;
  void OnEvent(const worker::StreamEvent& e) override;
  void UpdateLoad() override;
  worker::LlmEngine& engine() override { return *engine_; }
  LanguageMetrics& metrics() override { return metrics_; }

  // The batch and usage of a finished request's final event.
  void FillFinal(LiveRequest& r, const worker::StreamEvent& e, double now, v1::TokenBatch& b);
  // An engine step and its metrics; ends every request in the engine when
  // it fails.
  void StepEngine();
  // A tensor-parallel rank died: ends every request in the engine with
  // `why` and tells main (options_.on_fatal) once.
  void LoseRank(const absl::Status& why);
  // A new request starts its images; a registered one (role decode) says
  // it is held.
  void OnInstall(std::unique_ptr<LiveRequest> r);
  void OnAbort(const std::string& id, const std::string& reason);
  void OnShutDown();
  // Loop thread only, from here on.
  // A request whose images all arrived: the role's, or the engine's.
  void Admit(LiveRequest& r);
  v1::TokenBatch Batch(const LiveRequest& r, const worker::StreamEvent& e) const;
  // Ends every request the engine holds with `why`.
  void EndInEngine(const absl::Status& why);
  void CheckLostDeadlines();

  const LanguageCoreOptions options_;
  bool lost_rank_reported_ = false;  // loop thread only
  transfer::TransferEngine& transfer_;
  std::unique_ptr<worker::LlmEngine> engine_;
  // What the role changes (role.h); declared after the engine, whose KV
  // cache it registers, so it goes first.
  std::unique_ptr<Role> role_;
  LanguageMetrics metrics_;
  RequestTable requests_;
  std::unique_ptr<PrefixDigest> prefixes_;  // loop thread; set by Create

  mutable absl::Mutex load_mu_;
  v1::LoadReport load_ ABSL_GUARDED_BY(load_mu_);

  // Loop thread only.
  double engine_handoff_seconds_ = 0;      // what the counter has of the engine's
  int64_t engine_rows_by_descriptor_ = 0;  // as engine_handoff_seconds_
  int64_t engine_rows_inline_ = 0;
  double engine_mask_seconds_ = 0;
  double engine_mask_wait_seconds_ = 0;
  double step_time_us_ = 0;  // moving average of a step, for the load report
  uint32_t last_batch_ = 0;  // requests in the last step

  bool shut_down_ = false;  // loop thread: ShutDown was handled

  // Last: their threads stop before anything they use goes.
  std::unique_ptr<MediaGather> images_;  // its connector thread
  std::unique_ptr<MessageLoop<Message>> loop_;
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_LANGUAGE_CORE_H_
