// GenerateCall's migration: a colocated call whose language instance is
// lost moves to another instance, which resumes the request from the tokens
// the call relayed (generate_call.h).
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "router/generate_call.h"

namespace mmserve::router {
namespace {

std::vector<size_t> ImageIndices(const internal::v1::PrefillRequest& request) {
  std::vector<size_t> out;
  for (const auto& image : request.images()) out.push_back(image.image_index());
  return out;
}

}  // namespace

void GenerateCall::PrepareMigration(internal::v1::PrefillRequest& prefill) {
  // An elastic pool keeps its own books of where requests run.
  if (context_.options.migration_limit <= 0 || context_.elastic != nullptr) return;
  // The resumed stream must draw from the same random stream: a request
  // without a seed gets one here rather than on the instance.
  if (!prefill.sampling().has_seed()) {
    std::random_device rd;
    prefill.mutable_sampling()->set_seed((static_cast<uint64_t>(rd()) << 32) ^ rd());
  }
  language_request_ = prefill;
}

bool GenerateCall::MaybeMigrate(size_t i, const absl::Status& why) {
  if (!language_request_ || placer_ == nullptr || chain_->carrier() != i) return false;
  // The final response came (or nothing is open): nothing to resume.
  if (phase_ != CallPhase::kPrefilling && phase_ != CallPhase::kDecoding) return false;
  const CallMetrics& m = *context_.metrics;
  if (static_cast<int>(lost_instances_.size()) >= context_.options.migration_limit) {
    m.migrations_over_limit.Increment();
    return false;
  }
  const std::string& lost = placement_.instances[i]->id;
  LOG(WARNING) << "request " << id_ << ": moving off language instance " << lost << " after "
               << relayed_tokens_.size() << " tokens: " << why;
  lost_instances_.push_back(lost);
  live_from_ = placement_.instances.size();
  if (cancels_[i]) deferred_.Defer(std::move(cancels_[i]));
  cancels_[i] = nullptr;
  PlaceRequest again{.id = id_,
                     .request = &request_,
                     .images = &no_media_,
                     .deadline = deadline_,
                     .exclude = lost_instances_};
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
          "language instance ", lost_instances_.back(),
          " failed and no other can resume the request: ",
          placement.ok() ? "not a colocated placement" : placement.status().message())));
    } else if (absl::StatusOr<std::vector<internal::v1::PromptImage>> copies =
                   CopyImages(ImageIndices(*language_request_));
               !copies.ok()) {
      End(copies.status());  // a transfer has one receiver: the new one gets copies
    } else {
      m.migrations_resumed.Increment();
      language_request_->clear_images();
      for (auto& c : *copies) *language_request_->add_images() = std::move(c);
      resuming_ = language_request_->images_size() > 0;  // they may move until it streams
      const size_t k = placement_.instances.size();
      std::shared_ptr<Instance> instance = placement->instances[0];
      placement_.instances.push_back(std::move(instance));
      cancels_.push_back(nullptr);
      chain_.emplace(std::vector<Carrier>{{.instance = k}});
      internal::v1::PrefillRequest prefill = *language_request_;
      for (uint32_t t : relayed_tokens_) prefill.add_resume_output_token_ids(t);
      CountCriticalRoundTrip();
      OpenStream(k, std::move(prefill));
    }
  }
  deferred_.Run();
}

}  // namespace mmserve::router
