// A Generate call on a role-both language instance: one Prefill stream
// carries every token (kPlacing -> kPrefilling -> kDecoding -> kFinalHeld ->
// kEnded). Built by GenerateCall::Start, also for requests rejected before
// placement (then without an instance). Thread-safe.
#ifndef MMSERVE_ROUTER_COLOCATED_CALL_H_
#define MMSERVE_ROUTER_COLOCATED_CALL_H_

#include <memory>
#include <vector>

#include "router/generate_call.h"
#include "router/token_stream.h"

namespace mmserve::router {

class ColocatedCall final : public GenerateCall {
 public:
  explicit ColocatedCall(Setup setup) : GenerateCall(std::move(setup)) {}

 private:
  void StartLanguage(internal::v1::PrefillRequest prefill) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetryImages(std::vector<internal::v1::PromptImage> images) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::shared_ptr<Instance>> LanguageInstances() const override;
  void CancelStreams(const absl::Status& status) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void OnBatch(const internal::v1::TokenBatch& batch) ABSL_LOCKS_EXCLUDED(mu_);
  void OnDone(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  // Open from kPrefilling until it closes.
  std::shared_ptr<PrefillStream> stream_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_COLOCATED_CALL_H_
