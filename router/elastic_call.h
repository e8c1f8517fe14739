// A Generate call under the elastic manager (router --esp,
// docs/elastic.md): the request waits in the EspPool's queue until the
// manager places it, then runs on one elastic instance (degree 1: an
// ordinary Prefill stream that carries every token, as on role both) or on
// a group (an EspPrefill stream to every member at once):
//
//   kPlacing (queued, then images dispatched) -> kPrefilling (streams open)
//   -> kDecoding (the sampler's first token) -> kFinalHeld -> kEnded
//
// In a group the sampler's stream carries the first token and the
// master's the rest; the master's batches (and its OK close) that arrive
// before the first token are held and relayed after it. The other members'
// streams end OK once their span is kept. With decode ranges in the plan
// the masters form a chain (language_service/esp_plan.h EspMasterChain): a
// master whose range is full sends TokenBatch.esp_moved as its last batch,
// the call passes that state to the next master with EspMoveMaster
// (deadline: the call's) and relays the next master's stream from then on
// (mmserve_router_esp_master_moves_total); the next master's stream is open
// from the start and carries nothing before it. Any member's stream
// failing, a failed move, or any member going down, ends the call
// (UNAVAILABLE for a lost instance).
// Ending for any reason cancels the open streams and tells the pool
// (EspPool::Finished), which frees the request's slots and sends Abort to
// every member of its group. Built by GenerateCall::Start. Thread-safe.
#ifndef MMSERVE_ROUTER_ELASTIC_CALL_H_
#define MMSERVE_ROUTER_ELASTIC_CALL_H_

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "router/esp_pool.h"
#include "router/esp_prompt.h"
#include "router/generate_call.h"
#include "router/token_stream.h"

namespace mmserve::router {

class ElasticCall final : public GenerateCall {
 public:
  // `length`: the request's size (esp_prompt.h); an error ends the call.
  ElasticCall(Setup setup, EspPool& pool, absl::StatusOr<EspLength> length)
      : GenerateCall(std::move(setup)), pool_(pool), length_(std::move(length)) {}

 private:
  void Place() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartLanguage(internal::v1::PrefillRequest prefill) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetryImages(std::vector<internal::v1::PromptImage> images) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::shared_ptr<Instance>> LanguageInstances() const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CancelStreams(const absl::Status& status) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<ElasticCall> Self();
  TokenStreamHandlers Handlers(size_t member);
  void OnPlaced(absl::StatusOr<EspPlacement> placement) ABSL_LOCKS_EXCLUDED(mu_);
  void OnBatch(size_t member, const internal::v1::TokenBatch& batch) ABSL_LOCKS_EXCLUDED(mu_);
  void OnDone(size_t member, const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  void LockedOnBatch(size_t member, const internal::v1::TokenBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LockedOnDone(size_t member, const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Relays a batch of the token stream (member `member`'s).
  void Relay(size_t member, const internal::v1::TokenBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // From now on the master's stream carries the tokens: its held batches
  // (and OK close) are replayed.
  void HandToMaster() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A batch of the carrying master's stream: relayed, or its move.
  void Carry(const internal::v1::TokenBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next master of the chain takes over from `state`.
  void MoveMaster(const internal::v1::EspMasterState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnMoveFailed(size_t member, const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  EspPool& pool_;
  const absl::StatusOr<EspLength> length_;
  // Set once, at placement.
  std::vector<std::shared_ptr<Instance>> members_ ABSL_GUARDED_BY(mu_);
  std::optional<internal::v1::EspPlan> plan_ ABSL_GUARDED_BY(mu_);
  size_t sampler_ ABSL_GUARDED_BY(mu_) = 0;
  // The masters in decode order and the one that carries now (master_).
  std::vector<size_t> chain_ ABSL_GUARDED_BY(mu_);
  size_t chain_at_ ABSL_GUARDED_BY(mu_) = 0;
  size_t master_ ABSL_GUARDED_BY(mu_) = 0;
  // Cancels member i's stream while it is open (null once it closed).
  std::vector<std::function<void()>> cancels_ ABSL_GUARDED_BY(mu_);
  // Whether the master's stream carries the tokens (after the first).
  bool master_carries_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<internal::v1::TokenBatch> held_ ABSL_GUARDED_BY(mu_);
  bool held_closed_ok_ ABSL_GUARDED_BY(mu_) = false;
  // The member whose stream carried the final response.
  std::optional<size_t> final_member_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_ELASTIC_CALL_H_
