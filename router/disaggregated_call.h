// A Generate call on a prefill instance and a decode instance. The decode
// instance holds the request first (the empty first batch of its Decode
// stream), then the Prefill stream starts; it carries the first token and
// ends with the hand-off batch (the KV is on the decode instance), after
// which the Decode stream carries the rest:
//
//   kPlacing -> (decode holds the request) kPrefilling -> (hand-off batch:
//   first token, KV handed off) kDecoding -> kHandedOff -> kFinalHeld -> kEnded
//
// The two streams are not ordered: Decode batches (and an OK close) that
// reach the router before the hand-off batch are held and relayed after it.
// A first token that is also the last ends the call from the Prefill stream
// and cancels the decode instance's registration. Thread-safe.
#ifndef MMSERVE_ROUTER_DISAGGREGATED_CALL_H_
#define MMSERVE_ROUTER_DISAGGREGATED_CALL_H_

#include <memory>
#include <optional>
#include <vector>

#include "router/generate_call.h"
#include "router/token_stream.h"

namespace mmserve::router {

class DisaggregatedCall final : public GenerateCall {
 public:
  DisaggregatedCall(Setup setup, std::shared_ptr<Instance> decode)
      : GenerateCall(std::move(setup)), decode_(std::move(decode)) {}

 private:
  // Decode stream events that arrived before the hand-off batch.
  struct HeldDecode {
    std::vector<internal::v1::TokenBatch> batches;
    bool closed_ok = false;
  };

  void StartLanguage(internal::v1::PrefillRequest prefill) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetryImages(std::vector<internal::v1::PromptImage> images) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::shared_ptr<Instance>> LanguageInstances() const override;
  void CancelStreams(const absl::Status& status) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The decode instance holds the request: the prefill starts.
  void StartPrefill() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the Decode stream carries the tokens (or carried the final one).
  bool HandedOff() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<DisaggregatedCall> Self();

  void OnPrefillBatch(const internal::v1::TokenBatch& batch) ABSL_LOCKS_EXCLUDED(mu_);
  void OnPrefillDone(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  void OnDecodeBatch(const internal::v1::TokenBatch& batch) ABSL_LOCKS_EXCLUDED(mu_);
  void OnDecodeDone(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  void LockedOnPrefillBatch(const internal::v1::TokenBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LockedOnDecodeBatch(const internal::v1::TokenBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LockedOnDecodeDone(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<Instance> decode_;
  // In kPlacing: the Prefill call, waiting for the decode instance to hold
  // the request.
  std::optional<internal::v1::PrefillRequest> pending_prefill_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<PrefillStream> prefill_stream_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<DecodeStream> decode_stream_ ABSL_GUARDED_BY(mu_);
  HeldDecode held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_DISAGGREGATED_CALL_H_
