// One Generate request as the router runs it (ARCHITECTURE.md 2, steps 2-9):
// validate, hash and pre-size every image, place each image on an encoder by
// rendezvous hashing of its content hash and the request on the language
// instance with the least outstanding work, then call Encode on the encoders
// and Prefill on the language instance at the same time and relay the token
// stream to the sink.
//
//   auto call = GenerateCall::Start(context, request, sink, deadline);
//   ...
//   call->Cancel("client cancelled");   // from the client's side, any time
//
// Failures: a bad request ends at once with INVALID_ARGUMENT, before any
// backend is called. An encoder that fails (Encode error other than a bad
// image, a lost image reported by the language side, or the instance table
// marking it down) has its images re-encoded elsewhere and the language side
// told the new sources (RetryImages), up to kMaxAttempts per image; with no
// encoder left the call ends with UNAVAILABLE. A language instance that fails
// ends the call with UNAVAILABLE. Ending for any reason cancels every child
// call, which makes each process free what the request held. The sink's
// on_end runs exactly once, after the last on_response. Thread-safe.
#ifndef MMSERVE_ROUTER_GENERATE_CALL_H_
#define MMSERVE_ROUTER_GENERATE_CALL_H_

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/metrics.h"
#include "model/image_decode.h"
#include "model/image_tokens.h"
#include "model/model_config.h"
#include "proto/inference.pb.h"
#include "router/instance_table.h"
#include "router/request_validation.h"

namespace mmserve::router {

// What the router shares with every call.
struct RouterContext {
  RouterOptions options;
  InstanceTable* instances = nullptr;
  metrics::Registry* metrics = nullptr;
};

struct CallSink {
  std::function<void(mmserve::v1::GenerateResponse)> on_response;
  std::function<void(absl::Status)> on_end;
};

class GenerateCall : public std::enable_shared_from_this<GenerateCall> {
 public:
  static constexpr int kMaxAttempts = 3;

  // Validates and starts the call; on a validation error the sink's on_end
  // has already run when this returns.
  static std::shared_ptr<GenerateCall> Start(const RouterContext& context,
                                             mmserve::v1::GenerateRequest request, CallSink sink,
                                             std::chrono::system_clock::time_point deadline);
  ~GenerateCall();

  void Cancel(const std::string& reason);
  // The instance table saw `instance_id` go down.
  void OnInstanceDown(const std::string& instance_id);
  const std::string& id() const { return id_; }

 private:
  struct Image {
    ContentHash hash;
    std::optional<model::ImageGrid> grid;  // when pre-sized
    std::string encoder_id;                // current source
    std::string transfer_id;
    int attempts = 0;
    std::set<std::string> failed_encoders;
  };
  struct Encode;
  class PrefillStream;

  GenerateCall(const RouterContext& context, mmserve::v1::GenerateRequest request, CallSink sink,
               std::chrono::system_clock::time_point deadline);
  absl::Status Prepare();
  void Run();
  // Sends `images` to encoders (new attempt each); fills `out` with their
  // language-side descriptors. Ends the call when an image has no encoder.
  bool Dispatch(const std::vector<size_t>& images, std::vector<internal::v1::PromptImage>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Redispatch(std::vector<size_t> images, const std::string& failed_encoder,
                  const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnEncoded(Encode* encode, const grpc::Status& status);
  // `from_decode`: the batch or end comes from the decode instance's Decode
  // stream (prefill/decode roles), else from the Prefill stream.
  void OnBatch(const internal::v1::TokenBatch& batch, bool from_decode);
  void OnLanguageDone(const grpc::Status& status, bool from_decode);
  void LockedOnEncoded(Encode* encode, const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LockedOnBatch(const internal::v1::TokenBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LockedOnDecodeBatch(const internal::v1::TokenBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LockedOnLanguageDone(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LockedOnDecodeDone(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The end of the stream that carries the final response (`role` and
  // `instance_id` name it in errors): OK needs the final response seen; a lost
  // instance becomes UNAVAILABLE.
  void LockedEndLastStream(const grpc::Status& status, absl::string_view role,
                           absl::string_view instance_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LockedCancel(const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LockedOnInstanceDown(const std::string& instance_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void End(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the held final response once every Encode call has answered, and
  // ends the call once the language stream has closed too.
  void MaybeSendFinal() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // gRPC may run reactions inline in the thread that starts or cancels a
  // call, so nothing that reaches gRPC or the sink runs under mu_: it is
  // deferred and run by the entry point once mu_ is released.
  void Defer(std::function<void()> action) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunDeferred() ABSL_LOCKS_EXCLUDED(mu_);

  const RouterContext& context_;
  mmserve::v1::GenerateRequest request_;
  const std::string id_;
  const std::chrono::system_clock::time_point deadline_;
  Stopwatch clock_;

  absl::Mutex mu_;
  CallSink sink_ ABSL_GUARDED_BY(mu_);
  std::vector<Image> images_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Encode>> encodes_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Instance> language_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<PrefillStream> stream_ ABSL_GUARDED_BY(mu_);
  // Prefill/decode roles: language_ is the prefill instance; the decode
  // instance streams from the second token on. Its batches wait in
  // early_decode_ until the prefill stream says the KV is handed off, and
  // the Prefill call waits in pending_prefill_ until the decode instance
  // holds the request (its stream's empty first batch).
  std::shared_ptr<Instance> decode_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<PrefillStream> decode_stream_ ABSL_GUARDED_BY(mu_);
  std::optional<internal::v1::PrefillRequest> pending_prefill_ ABSL_GUARDED_BY(mu_);
  bool decode_registered_ ABSL_GUARDED_BY(mu_) = false;
  bool handed_off_ ABSL_GUARDED_BY(mu_) = false;
  // The decode stream closed OK before the prefill stream's hand-off batch
  // reached the router (the two streams are not ordered).
  bool decode_done_early_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<internal::v1::TokenBatch> early_decode_ ABSL_GUARDED_BY(mu_);
  int64_t placed_tokens_ = 0;
  int next_attempt_ ABSL_GUARDED_BY(mu_) = 1;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // the final batch arrived
  bool first_token_ ABSL_GUARDED_BY(mu_) = false;
  bool language_ok_ ABSL_GUARDED_BY(mu_) = false;  // the stream closed with OK
  std::optional<mmserve::v1::GenerateResponse> final_response_ ABSL_GUARDED_BY(mu_);
  double last_token_s_ ABSL_GUARDED_BY(mu_) = 0;
  double first_token_s_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t cached_images_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t completion_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  double router_seconds_ = 0;  // time spent in the router before dispatch
  std::vector<std::function<void()>> deferred_ ABSL_GUARDED_BY(mu_);
  bool running_deferred_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_GENERATE_CALL_H_
