// Role elastic (docs/elastic.md): a full replica that the
// router's global manager may also make a member of an elastic
// sequence-parallelism group. A request that comes alone runs here as on
// role both (prefill and decode, nothing travels); the load report carries
// what the manager plans by (free KV token slots, batch size, step time).
//
//   ASSIGN_OR_RETURN(auto role, MakeRole({.kind = LanguageRole::kElastic}, id, registry));
//
// Group prefills (EspPrefill), held spans and multi-master decode are
// LanguageCore's EspGroups (esp_groups.h), which the core creates for
// this role.
// Thread-safety: as Role (the language core's loop thread).
#ifndef MMSERVE_LANGUAGE_SERVICE_ELASTIC_ROLE_H_
#define MMSERVE_LANGUAGE_SERVICE_ELASTIC_ROLE_H_

#include "language_service/role.h"

namespace mmserve::language {

class ElasticRole final : public Role {
 public:
  LanguageRole kind() const override { return LanguageRole::kElastic; }
  // A request alone: as role both (no decode instance named).
  [[nodiscard]] absl::Status CheckPrefill(const v1::PrefillRequest& request) const override;
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_ELASTIC_ROLE_H_
