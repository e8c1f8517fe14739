#include "router/elastic_call.h"

#include <utility>

#include "common/logging.h"
#include "language_service/esp_plan.h"

namespace mmserve::router {

std::shared_ptr<ElasticCall> ElasticCall::Self() {
  return std::static_pointer_cast<ElasticCall>(shared_from_this());
}

void ElasticCall::Place() {
  if (!length_.ok()) {
    End(length_.status());
    return;
  }
  absl::Status queued = pool_.Submit({.id = id_,
                                      .prompt_tokens = length_->prompt_tokens,
                                      .max_tokens = length_->max_tokens,
                                      .deadline = deadline_,
                                      .on_placed = [self = Self()](absl::StatusOr<EspPlacement> p) {
                                        self->OnPlaced(std::move(p));
                                      }});
  if (!queued.ok()) End(std::move(queued));
}

void ElasticCall::OnPlaced(absl::StatusOr<EspPlacement> placement) {
  {
    absl::MutexLock lock(&mu_);
    if (phase() != CallPhase::kEnded) {
      if (!placement.ok()) {
        End(placement.status());
      } else {
        members_ = std::move(placement->members);
        plan_ = std::move(placement->plan);
        Run();
      }
    }
  }
  deferred_.Run();
}

TokenStreamHandlers ElasticCall::Handlers(size_t member) {
  return {.on_batch = [self = Self(),
                       member](const internal::v1::TokenBatch& b) { self->OnBatch(member, b); },
          .on_done = [self = Self(), member](const grpc::Status& s) { self->OnDone(member, s); }};
}

void ElasticCall::StartLanguage(internal::v1::PrefillRequest prefill) {
  Advance(CallEvent::kPrefillStarted);
  if (!plan_) {
    auto stream = std::make_shared<PrefillStream>(std::move(prefill), deadline_, Handlers(0));
    cancels_.push_back([stream] { stream->Cancel(); });
    master_carries_ = true;
    deferred_.Defer([stream, lang = members_[0]] { stream->Begin(stream, *lang->language); });
    return;
  }
  sampler_ = plan_->sampler();
  for (int m : language::EspMasterChain(*plan_)) chain_.push_back(static_cast<size_t>(m));
  master_ = chain_[0];
  master_carries_ = sampler_ == master_;
  // A transfer has one receiver: every member past the first gets copies
  // of the images, all dispatched before any stream starts.
  std::vector<size_t> images;
  for (const auto& image : prefill.images()) images.push_back(image.image_index());
  std::vector<std::vector<internal::v1::PromptImage>> copies(members_.size());
  for (size_t m = 1; m < members_.size() && !images.empty(); ++m) {
    absl::StatusOr<std::vector<internal::v1::PromptImage>> c = CopyImages(images);
    if (!c.ok()) {
      End(c.status());
      return;
    }
    copies[m] = *std::move(c);
  }
  for (size_t m = 0; m < members_.size(); ++m) {
    internal::v1::EspPrefillRequest request;
    *request.mutable_request() = prefill;
    if (m > 0 && !images.empty()) {
      request.mutable_request()->clear_images();
      for (auto& c : copies[m]) *request.mutable_request()->add_images() = std::move(c);
    }
    *request.mutable_plan() = *plan_;
    request.set_member(static_cast<uint32_t>(m));
    auto stream = std::make_shared<EspStream>(std::move(request), deadline_, Handlers(m));
    cancels_.push_back([stream] { stream->Cancel(); });
    deferred_.Defer([stream, lang = members_[m]] { stream->Begin(stream, *lang->language); });
  }
}

void ElasticCall::RetryImages(std::vector<internal::v1::PromptImage> images) {
  std::vector<size_t> indices;
  for (const auto& image : images) indices.push_back(image.image_index());
  for (size_t m = 0; m < members_.size(); ++m) {
    if (m == 0 || !plan_) {
      SendRetryImages(members_[m], images);
      continue;
    }
    absl::StatusOr<std::vector<internal::v1::PromptImage>> copies = CopyImages(indices);
    if (!copies.ok()) {
      End(copies.status());
      return;
    }
    SendRetryImages(members_[m], *std::move(copies));
  }
}

std::vector<std::shared_ptr<Instance>> ElasticCall::LanguageInstances() const { return members_; }

void ElasticCall::CancelStreams(const absl::Status&) {
  for (auto& cancel : cancels_) {
    if (cancel) deferred_.Defer(std::move(cancel));
  }
  cancels_.assign(cancels_.size(), nullptr);
  deferred_.Defer([pool = &pool_, id = id_] { pool->Finished(id); });
}

void ElasticCall::OnBatch(size_t member, const internal::v1::TokenBatch& batch) {
  {
    absl::MutexLock lock(&mu_);
    LockedOnBatch(member, batch);
  }
  deferred_.Run();
}

void ElasticCall::LockedOnBatch(size_t member, const internal::v1::TokenBatch& batch) {
  if (phase() == CallPhase::kEnded || final_member_) return;
  if (batch.lost_images_size() > 0) {
    RelayBatch(batch);  // re-dispatches the images
    return;
  }
  if (batch.token_ids_size() == 0 && !batch.has_esp_moved() &&
      batch.finish_reason() == mmserve::v1::FINISH_REASON_UNSPECIFIED) {
    return;  // nothing for the client
  }
  if (master_carries_) {
    if (member == master_) Carry(batch);
  } else if (member == sampler_) {
    Relay(member, batch);
    HandToMaster();
  } else if (member == master_) {
    held_.push_back(batch);
  }
}

void ElasticCall::Relay(size_t member, const internal::v1::TokenBatch& batch) {
  const bool first = phase() == CallPhase::kPrefilling;
  RelayBatch(batch);
  if (batch.finish_reason() != mmserve::v1::FINISH_REASON_UNSPECIFIED) final_member_ = member;
  if (first && phase() != CallPhase::kPrefilling) {
    deferred_.Defer([pool = &pool_, id = id_] { pool->Decoding(id); });
  }
}

void ElasticCall::HandToMaster() {
  master_carries_ = true;
  std::vector<internal::v1::TokenBatch> held = std::move(held_);
  held_.clear();
  for (const auto& b : held) {
    if (phase() == CallPhase::kEnded || final_member_) return;
    Carry(b);
  }
  if (held_closed_ok_) LockedOnDone(chain_[0], grpc::Status::OK);  // only the first is held
}

void ElasticCall::Carry(const internal::v1::TokenBatch& batch) {
  if (!batch.has_esp_moved()) {
    Relay(master_, batch);
  } else if (chain_at_ + 1 >= chain_.size()) {
    End(absl::InternalError("the last elastic master moved on"));
  } else {
    MoveMaster(batch.esp_moved());
  }
}

void ElasticCall::MoveMaster(const internal::v1::EspMasterState& state) {
  master_ = chain_[++chain_at_];
  auto request = std::make_shared<internal::v1::EspMoveRequest>();
  request->set_request_id(id_);
  *request->mutable_state() = state;
  auto ctx = std::make_shared<grpc::ClientContext>();
  ctx->set_deadline(deadline_);
  auto ack = std::make_shared<internal::v1::EspMoveAck>();
  deferred_.Defer([self = Self(), lang = members_[master_], member = master_, ctx, request, ack,
                   pool = &pool_, id = id_] {
    pool->MasterMoved(id, member);
    lang->language->async()->EspMoveMaster(ctx.get(), request.get(), ack.get(),
                                           [self, member, ctx, request, ack](grpc::Status s) {
                                             if (!s.ok()) self->OnMoveFailed(member, s);
                                           });
  });
}

void ElasticCall::OnMoveFailed(size_t member, const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    LOG(WARNING) << "EspMoveMaster " << id_ << ": " << status.error_message();
    if (phase() != CallPhase::kEnded) {
      LastStreamClosed(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the master move failed"),
                       "elastic member", members_[member]->id);
    }
  }
  deferred_.Run();
}

void ElasticCall::OnDone(size_t member, const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    LockedOnDone(member, status);
  }
  deferred_.Run();
}

void ElasticCall::LockedOnDone(size_t member, const grpc::Status& status) {
  if (member < cancels_.size()) cancels_[member] = nullptr;
  if (phase() == CallPhase::kEnded) return;
  const std::string& id = members_[member]->id;
  const char* role = plan_ ? "elastic member" : "language";
  if (!status.ok() || final_member_ == member) {
    LastStreamClosed(status, role, id);
    return;
  }
  if (member == master_ && !final_member_) {
    if (!master_carries_) {
      held_closed_ok_ = true;  // replayed after the first token
      return;
    }
    LastStreamClosed(status, role, id);  // ended without a final response
    return;
  }
  // The sampler closed without a first token: the master carries them all.
  if (member == sampler_ && !master_carries_) HandToMaster();
  // Otherwise a member kept its span (or the sampler sent the first token).
}

}  // namespace mmserve::router
