#include "router/call_migration.h"

#include <random>
#include <utility>

namespace mmserve::router {

void CallMigration::Keep(internal::v1::PrefillRequest& prefill) {
  if (limit_ <= 0) return;
  if (!prefill.sampling().has_seed()) {
    std::random_device rd;
    prefill.mutable_sampling()->set_seed((static_cast<uint64_t>(rd()) << 32) ^ rd());
  }
  request_ = prefill;
}

void CallMigration::Relayed(const internal::v1::TokenBatch& batch) {
  if (batch.token_ids_size() > 0) resuming_ = false;
  relayed_.insert(relayed_.end(), batch.token_ids().begin(), batch.token_ids().end());
}

CallMigration::Decision CallMigration::Leave(const std::string& instance, size_t streams) {
  if (!request_) return Decision::kNo;
  if (static_cast<int>(lost_.size()) >= limit_) return Decision::kOverLimit;
  lost_.push_back(instance);
  live_from_ = streams;
  return Decision::kMove;
}

std::vector<size_t> CallMigration::ImageIndices() const {
  std::vector<size_t> out;
  for (const auto& image : request_->images()) out.push_back(image.image_index());
  return out;
}

internal::v1::PrefillRequest CallMigration::Resume(std::vector<internal::v1::PromptImage> images) {
  request_->clear_images();
  for (auto& image : images) *request_->add_images() = std::move(image);
  resuming_ = request_->images_size() > 0;
  internal::v1::PrefillRequest prefill = *request_;
  for (uint32_t t : relayed_) prefill.add_resume_output_token_ids(t);
  return prefill;
}

}  // namespace mmserve::router
