#include "language_service/role.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "language_service/decode_role.h"
#include "language_service/elastic_role.h"
#include "language_service/kv_bytes_moved.h"
#include "language_service/prefill_role.h"
#include "language_service/prompt_media.h"

namespace mmserve::language {
namespace {

// Role both: prefill and decode here; nothing travels.
class BothRole final : public Role {
 public:
  absl::Status CheckPrefill(const v1::PrefillRequest& request) const override {
    if (!request.decode().instance_id().empty()) {
      return absl::InvalidArgumentError("role both hands no KV to a decode instance");
    }
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Role>> MakeRole(const RoleOptions& options,
                                               const std::string& instance_id,
                                               metrics::Registry& metrics,
                                               const ElasticGroupsOptions& elastic) {
  // Every role shows the hand-off counters (at 0 where nothing is handed off).
  const transfer::WireBytes handoff = KvBytesMoved(metrics, "handoff");
  switch (options.kind) {
    case LanguageRole::kBoth:
      return std::make_unique<BothRole>();
    case LanguageRole::kPrefill:
      return std::make_unique<PrefillRole>(options, instance_id, handoff);
    case LanguageRole::kDecode:
      return std::make_unique<DecodeRole>(options, instance_id, handoff);
    case LanguageRole::kElastic: {
      ElasticGroupsOptions groups = elastic;
      groups.name = instance_id;
      groups.profile = options.kv_profile;
      return std::make_unique<ElasticRole>(groups, metrics);
    }
  }
  return absl::InvalidArgumentError("unknown language role");
}

absl::StatusOr<std::vector<worker::HandoffMedia>> HandoffImagesFromProto(
    const v1::KvAllocateRequest& request) {
  constexpr uint32_t kMaxSide = 1 << 16;  // patches; keeps t * h * w in range
  std::vector<worker::HandoffMedia> out;
  for (const v1::KvImageSpan& s : request.images()) {
    if (s.offset() >= static_cast<uint32_t>(request.prompt_token_ids_size()) || s.grid_t() == 0 ||
        s.grid_h() == 0 || s.grid_w() == 0 || s.grid_t() > kMaxSide || s.grid_h() > kMaxSide ||
        s.grid_w() > kMaxSide) {
      return absl::InvalidArgumentError(
          absl::StrCat("hand-off image ", out.size(), " has offset ", s.offset(), " and grid ",
                       s.grid_t(), "x", s.grid_h(), "x", s.grid_w(), " for a prompt of ",
                       request.prompt_token_ids_size(), " tokens"));
    }
    worker::HandoffMedia h;
    h.offset = static_cast<int>(s.offset());
    h.grid = model::MediaGrid::FromThw(static_cast<int>(s.grid_t()), static_cast<int>(s.grid_h()),
                                       static_cast<int>(s.grid_w()));
    ASSIGN_OR_RETURN(h.grid.kind, MediaKindFromProto(s.kind()));
    if (s.has_time_step()) {
      if (int64_t{s.grid_t() - 1} * s.time_step() > INT32_MAX) {
        return absl::InvalidArgumentError(
            absl::StrCat("hand-off image ", out.size(), " has time step ", s.time_step()));
      }
      h.grid.time_step = static_cast<int>(s.time_step());
    }
    h.key = ContentHash{s.content_hash().high(), s.content_hash().low()};
    out.push_back(h);
  }
  return out;
}

}  // namespace mmserve::language
