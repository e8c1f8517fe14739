// One Generate request as the router runs it (docs/lifecycle.md):
// validate, hash and pre-size every image, place each image on an encoder by
// rendezvous hashing of its content hash and the request's language side
// by its placer (placer.h, docs/routing.md), then call Encode on the encoders
// and Prefill on the language instance at the same time and relay the token
// stream to the sink.
//
//   auto call = GenerateCall::Start(context, request, sink, deadline);
//   ...
//   call->Cancel("client cancelled");   // from the client's side, any time
//
// Placement comes first (placer.h): a Placer returns the instances and the
// carrier order, the token streams that carry the tokens in turn
// (colocated: [prefill]; P/D: [prefill -> decode]; elastic: [sampler ->
// master0 -> master1 ...]). The call relays that chain the same way for
// every flow (carrier_chain.h): stream i+1's batches, and its OK close, are
// held until stream i hands over, and each hand-over is a CallPhase event
// (kCarrierMoved). The P/D decode stream is opened first and the prefill
// stream once the decode instance holds the request (its empty first
// batch); an elastic group's master hands over by sending its state, which
// the call passes to the next master with ElasticMoveMaster (deadline: the
// call's). The placer hears every phase change and the end (the elastic
// pool learns from them which instance decodes what). The call's
// lifecycle is one CallPhase (call_phase.h), changed only by Advance;
// docs/lifecycle.md draws it.
//
// Failures: a bad request ends at once with INVALID_ARGUMENT, before any
// backend is called. An encoder that fails (Encode error other than a bad
// image, a lost image reported by the language side, or the instance table
// marking it down) has its images re-encoded elsewhere and the language side
// told the new sources (RetryImages), up to kMaxAttempts per image; with no
// encoder left the call ends with UNAVAILABLE. A language instance that fails
// (any of the call's streams failing, or an elastic master move refused)
// ends the call with UNAVAILABLE, except that a colocated call's stream
// (role both, router not --elastic) migrates: the request is placed again
// away from the lost instances and resumed there from the tokens already
// relayed (PrefillRequest.resume_output_token_ids, the same seed: the
// router draws one for a request without; its images copied), up to
// RouterOptions::migration_limit times; the client's stream goes on
// unbroken. Ending for any reason cancels every open
// child call, which makes each process free what the request held. The sink's
// on_end runs exactly once, after the last on_response, with the status a
// client may see (PublicStatus, public_error.h); the whole status goes to
// the log with the request id.
//
// Thread-safe. gRPC may run reactions inline in the thread that starts or
// cancels a call, so nothing that reaches gRPC or the sink runs under mu_:
// it is deferred (DeferredActions) and run by the entry point once mu_ is
// released.
#ifndef MMSERVE_ROUTER_GENERATE_CALL_H_
#define MMSERVE_ROUTER_GENERATE_CALL_H_

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "proto/inference.pb.h"
#include "proto/language.pb.h"
#include "router/call_migration.h"
#include "router/call_phase.h"
#include "router/carrier_chain.h"
#include "router/deferred_actions.h"
#include "router/elastic_echo_hold.h"
#include "router/encoder_dispatch.h"
#include "router/instance_table.h"
#include "router/placer.h"
#include "router/router_context.h"

namespace mmserve::router {

class GenerateCall final : public std::enable_shared_from_this<GenerateCall> {
 public:
  static constexpr int kMaxAttempts = EncoderDispatch::kMaxAttempts;

  // Validates, places and starts the call; on a validation or placement
  // error the sink's on_end has already run when this returns.
  static std::shared_ptr<GenerateCall> Start(const RouterContext& context,
                                             mmserve::v1::GenerateRequest request, CallSink sink,
                                             std::chrono::system_clock::time_point deadline);
  ~GenerateCall();
  GenerateCall(const GenerateCall&) = delete;
  GenerateCall& operator=(const GenerateCall&) = delete;

  void Cancel(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  // The instance table saw `instance_id` go down.
  void OnInstanceDown(const std::string& instance_id) ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& id() const { return id_; }

 private:
  // What a call is built from; `placer` is null when the call was rejected
  // before placement.
  struct Setup {
    const RouterContext* context = nullptr;
    mmserve::v1::GenerateRequest request;
    CallSink sink;
    std::chrono::system_clock::time_point deadline;
    Stopwatch clock;  // started at receipt
    std::vector<PreparedMedia> images;
    std::unique_ptr<Placer> placer;
  };
  explicit GenerateCall(Setup setup);

  // Placement (generate_call.cc).
  void OnPlaced(absl::StatusOr<Placement> placement) ABSL_LOCKS_EXCLUDED(mu_);
  // Dispatches the images and starts the language side (StartLanguage).
  void Run() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The streams (call_streams.cc). Opens the placement's streams; `prefill`
  // already describes every image.
  void StartLanguage(internal::v1::PrefillRequest prefill) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens stream `i` (on instance i) with `request`.
  template <typename Request>
  void OpenStream(size_t i, Request request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // P/D: the decode instance holds the request; the prefill stream opens.
  void StartPrefill() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // New sources for images of a running request (after a re-dispatch).
  void RetryImages(std::vector<internal::v1::PromptImage> images)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnStreamBatch(size_t i, const internal::v1::TokenBatch& batch) ABSL_LOCKS_EXCLUDED(mu_);
  void OnStreamDone(size_t i, const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  void LockedOnStreamBatch(size_t i, const internal::v1::TokenBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LockedOnStreamDone(size_t i, const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A batch of the carrier: relayed, and its hand-over followed.
  void Carry(const internal::v1::TokenBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next carrier carries from now on (an elastic master taking over
  // from `state` first, when given): what it sent early is replayed.
  void MoveCarrier(const internal::v1::ElasticMasterState* state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Elastic: the master on instance `next` takes over from `state`.
  void SendMoveMaster(size_t next, const internal::v1::ElasticMasterState& state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnMoveFailed(size_t i, const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // What stream i is called in errors ("language", "decode", "elastic member").
  const char* StreamRole(size_t i) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The call is ending: cancel every open stream.
  void CancelStreams() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Migration (generate_call_migrate.cc). Whether the loss of stream `i`'s
  // instance (`why`) moves the request on: then the stream is left behind
  // (cancelled, its later events ignored) and the call is placed again.
  bool MaybeMigrate(size_t i, const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The resumed stream opens on the new placement's instance.
  void OnMigrationPlaced(absl::StatusOr<Placement> placement) ABSL_LOCKS_EXCLUDED(mu_);
  // A stream a migration left behind.
  bool Abandoned(size_t i) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return migration_.Abandoned(i);
  }
  // The colocated stream's request kept for a migration (call_migration.h).
  void PrepareMigration(internal::v1::PrefillRequest& prefill) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Moves the lifecycle on (call_phase.h) and tells the placer; false, with
  // a warning, when `event` cannot happen in the current phase (a peer
  // broke the protocol).
  bool Advance(CallEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A batch from the carrier: lost images re-encode, tokens go to the
  // sink, the final response is held.
  void RelayBatch(const internal::v1::TokenBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The stream that carries the final response, or any stream with an
  // error, closed (`role` and `instance_id` name it in errors): OK needs
  // the final response seen; a lost instance becomes UNAVAILABLE.
  void LastStreamClosed(const grpc::Status& status, absl::string_view role,
                        absl::string_view instance_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void End(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The images again for another receiver (EncoderDispatch::DispatchCopy):
  // an elastic group's members past the first.
  [[nodiscard]] absl::StatusOr<std::vector<internal::v1::PromptImage>> CopyImages(
      const std::vector<size_t>& images) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls RetryImages on `language` (deferred).
  void SendRetryImages(std::shared_ptr<Instance> language,
                       std::vector<internal::v1::PromptImage> images)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The call starts an RPC whose answer the first token waits for, after the
  // ones counted before (mmserve_router_critical_round_trips): a no-op from
  // the first token on.
  void CountCriticalRoundTrip() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The language instances the call is placed on; empty before placement.
  const std::vector<std::shared_ptr<Instance>>& LanguageInstances() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The final response from the moment it arrives (kFinalHeld).
  struct HeldFinal {
    std::optional<mmserve::v1::GenerateResponse> response;  // until sent
    bool stream_closed = false;                             // its carrier closed OK
  };

  EncoderDispatch::OnEncoded OnEncodedCallback();
  void OnEncoded(EncoderDispatch::Encode* encode, const grpc::Status& status)
      ABSL_LOCKS_EXCLUDED(mu_);
  void LockedOnEncoded(EncoderDispatch::Encode* encode, const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Redispatch(const std::vector<size_t>& images, const std::string& failed_encoder,
                  const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LockedOnInstanceDown(const std::string& instance_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes the tokens of `batch` (TTFT, ITL).
  void CountTokens(const internal::v1::TokenBatch& batch, double now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the held final response once every Encode call has answered, and
  // ends the call once its stream has closed OK too.
  void MaybeSendFinal() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordEnd(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RouterContext& context_;
  const mmserve::v1::GenerateRequest request_;
  const std::string id_;
  const std::chrono::system_clock::time_point deadline_;
  const std::unique_ptr<Placer> placer_;
  absl::Mutex mu_;
  DeferredActions deferred_;

  Stopwatch clock_;
  double router_seconds_ = 0;  // time spent in the router before dispatch
  CallPhase phase_ ABSL_GUARDED_BY(mu_) = CallPhase::kPlacing;
  CallSink sink_ ABSL_GUARDED_BY(mu_);
  EncoderDispatch encoders_ ABSL_GUARDED_BY(mu_);
  // Set once, at placement.
  Placement placement_ ABSL_GUARDED_BY(mu_);
  std::optional<CarrierChain> chain_ ABSL_GUARDED_BY(mu_);
  // Cancels stream i while it is open (null before it opens and once it closed).
  std::vector<std::function<void()>> cancels_ ABSL_GUARDED_BY(mu_);
  // P/D, until the decode instance holds the request: the Prefill call.
  std::optional<internal::v1::PrefillRequest> pending_prefill_ ABSL_GUARDED_BY(mu_);
  std::optional<HeldFinal> final_ ABSL_GUARDED_BY(mu_);
  double last_token_s_ ABSL_GUARDED_BY(mu_) = 0;
  double first_token_s_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t completion_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int critical_round_trips_ ABSL_GUARDED_BY(mu_) = 0;
  CallMigration migration_ ABSL_GUARDED_BY(mu_);
  ElasticEchoHold echoes_ ABSL_GUARDED_BY(mu_);  // an elastic group's members' ends
  const std::vector<PreparedMedia> no_media_;    // a migration's placement request
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_GENERATE_CALL_H_
