#include "language_service/elastic_role.h"

namespace mmserve::language {

absl::Status ElasticRole::CheckPrefill(const v1::PrefillRequest& request) const {
  if (!request.decode().instance_id().empty()) {
    return absl::InvalidArgumentError("role elastic hands no KV to a decode instance");
  }
  return absl::OkStatus();
}

}  // namespace mmserve::language
