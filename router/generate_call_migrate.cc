// GenerateCall's migration: a colocated call whose language instance is
// lost moves to another instance, which resumes the request from the tokens
// the call relayed (generate_call.h, call_migration.h).
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "router/generate_call.h"

namespace mmserve::router {

void GenerateCall::PrepareMigration(internal::v1::PrefillRequest& prefill) {
  // An elastic pool keeps its own books of where requests run.
  if (context_.elastic == nullptr) migration_.Keep(prefill);
}

bool GenerateCall::MaybeMigrate(size_t i, const absl::Status& why) {
  if (!migration_.kept() || placer_ == nullptr || chain_->carrier() != i) return false;
  // The final response came (or nothing is open): nothing to resume.
  if (phase_ != CallPhase::kPrefilling && phase_ != CallPhase::kDecoding) return false;
  const std::string& lost = placement_.instances[i]->id;
  switch (migration_.Leave(lost, placement_.instances.size())) {
    case CallMigration::Decision::kNo:
      return false;
    case CallMigration::Decision::kOverLimit:
      context_.metrics->migrations_over_limit.Increment();
      return false;
    case CallMigration::Decision::kMove:
      break;
  }
  LOG(WARNING) << "request " << id_ << ": moving off language instance " << lost << " after "
               << migration_.relayed() << " tokens: " << why;
  if (cancels_[i]) deferred_.Defer(std::move(cancels_[i]));
  cancels_[i] = nullptr;
  PlaceRequest again{.id = id_,
                     .request = &request_,
                     .images = &no_media_,
                     .deadline = deadline_,
                     .exclude = migration_.lost()};
  // Outside mu_: a placer may answer inline.
  deferred_.Defer([self = shared_from_this(), again = std::move(again)] {
    self->placer_->Place(again, [self](absl::StatusOr<Placement> placement) {
      self->OnMigrationPlaced(std::move(placement));
    });
  });
  return true;
}

void GenerateCall::OnMigrationPlaced(absl::StatusOr<Placement> placement) {
  {
    absl::MutexLock lock(&mu_);
    const CallMetrics& m = *context_.metrics;
    if (phase_ == CallPhase::kEnded) {
      // The call ended meanwhile (a cancel): nothing opens.
    } else if (!placement.ok() || placement->instances.size() != 1) {
      m.migrations_no_instance.Increment();
      End(absl::UnavailableError(absl::StrCat(
          "language instance ", migration_.lost().back(),
          " failed and no other can resume the request: ",
          placement.ok() ? "not a colocated placement" : placement.status().message())));
    } else if (absl::StatusOr<std::vector<internal::v1::PromptImage>> copies =
                   CopyImages(migration_.ImageIndices());
               !copies.ok()) {
      End(copies.status());  // a transfer has one receiver: the new one gets copies
    } else {
      m.migrations_resumed.Increment();
      const size_t k = placement_.instances.size();
      placement_.instances.push_back(placement->instances[0]);
      cancels_.push_back(nullptr);
      chain_.emplace(std::vector<Carrier>{{.instance = k}});
      CountCriticalRoundTrip();
      OpenStream(k, migration_.Resume(*std::move(copies)));
    }
  }
  deferred_.Run();
}

}  // namespace mmserve::router
