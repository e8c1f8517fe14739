// Role elastic (docs/elastic.md): a full replica that the
// router's global manager may also make a member of an elastic
// sequence-parallelism group. A request that comes alone runs here as on
// role both (prefill and decode, nothing travels); the load report carries
// what the manager plans by (free KV token slots, batch size, step time).
//
//   ASSIGN_OR_RETURN(auto role, MakeRole({.kind = LanguageRole::kElastic}, id, registry, elastic));
//
// The role's own calls (ElasticCalls) are group prefills (ElasticPrefill), the
// master's move (ElasticMoveMaster) and held spans, over the role's ElasticGroups
// (elastic_groups.h): a member's request waits for its images as any other,
// then runs its part of the group prefill on the loop thread (Admit); the
// requests mastered here decode in the engine's batch and move on to their
// next master from the step hook (Step).
// Thread-safety: the calls are thread-safe (they run on the loop thread);
// everything else is the loop thread's, as Role.
#ifndef MMSERVE_LANGUAGE_SERVICE_ELASTIC_ROLE_H_
#define MMSERVE_LANGUAGE_SERVICE_ELASTIC_ROLE_H_

#include <memory>
#include <string>
#include <vector>

#include "language_service/elastic_groups.h"
#include "language_service/role.h"

namespace mmserve::language {

class ElasticRole final : public Role, public ElasticCalls {
 public:
  // `options`' name and profile are the instance's; `metrics` must outlive
  // the role.
  ElasticRole(const ElasticGroupsOptions& options, metrics::Registry& metrics)
      : options_(options), metrics_(metrics) {}

  absl::Status Attach(RoleHost& host) override;
  // A request alone: as role both (no decode instance named).
  [[nodiscard]] absl::Status CheckPrefill(const v1::PrefillRequest& request) const override;
  ElasticCalls* elastic_calls() override { return this; }
  void Describe(v1::InstanceInfo& info) const override { info.set_elastic_endpoint(endpoint()); }

  // A group member's request (ElasticPrefill) whose images are here runs its
  // part (blocking the loop for the group's prefill).
  bool Admit(LiveRequest& r) override;
  bool Owns(const LiveRequest& r) const override { return r.elastic_plan != nullptr; }
  // A member whose part ended OK keeps its span (until Abort or the lease).
  void Release(const std::string& id, const absl::Status& status) override;
  void AbortUnknown(const std::string& id) override;
  // The idle lease, and the requests mastered here whose range is done move
  // on (ElasticGroups::Step).
  bool Step() override;
  size_t num_running() const override { return groups_->num_decodes(); }

  absl::Status ElasticPrefill(const v1::ElasticPrefillRequest& request, RequestSink sink) override;
  absl::Status ElasticMoveMaster(const v1::ElasticMoveRequest& request) override;
  absl::StatusOr<std::vector<int32_t>> HoldSpan(const std::string& id, int tokens) override;
  std::string endpoint() const override { return groups_->endpoint(); }
  size_t num_held_spans() const override { return groups_->num_held_spans(); }

 private:
  // ElasticMoveMaster and HoldSpan on the loop thread.
  absl::Status MoveMasterHere(const v1::ElasticMoveRequest& request);
  absl::StatusOr<std::vector<int32_t>> HoldSpanHere(const std::string& id, int tokens);
  // A master's decode range is full: its stream's last batch hands the
  // state on and ends OK (its KV stays held as a span).
  void OnMasterMoved(const std::string& id, const worker::ElasticRequest::MasterState& state);

  const ElasticGroupsOptions options_;
  metrics::Registry& metrics_;
  RoleHost* host_ = nullptr;
  std::unique_ptr<ElasticGroups> groups_;  // after Attach
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_ELASTIC_ROLE_H_
