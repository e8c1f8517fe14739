#include "router/encoder_dispatch.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/encoder.grpc.pb.h"
#include "router/request_media.h"
#include "scheduler/placement.h"

namespace mmserve::router {

// One Encode call (an attempt at some of the request's images on one encoder).
struct EncoderDispatch::Encode {
  std::string encoder_id;
  std::vector<size_t> images;
  grpc::ClientContext ctx;
  internal::v1::EncodeRequest request;
  internal::v1::EncodeResponse response;
  bool done = false;
  bool copy = false;  // DispatchCopy's
};

EncoderDispatch::EncoderDispatch(const RouterContext& context,
                                 const mmserve::v1::GenerateRequest& request,
                                 std::chrono::system_clock::time_point deadline,
                                 const std::vector<PreparedMedia>& images)
    : context_(context), request_(request), deadline_(deadline), images_(images.size()) {
  for (size_t k = 0; k < images.size(); ++k) {
    images_[k].hash = images[k].hash;
    images_[k].grid = images[k].grid;
    images_[k].video = images[k].video;
    images_[k].timestamps = images[k].timestamps;
  }
}

EncoderDispatch::~EncoderDispatch() = default;

absl::StatusOr<std::shared_ptr<Instance>> EncoderDispatch::PickEncoder(size_t k) {
  Image& im = images_[k];
  if (++im.attempts > kMaxAttempts) {
    return absl::UnavailableError(
        absl::StrCat("image ", k, " failed on ", kMaxAttempts, " encoders"));
  }
  // Healthy encoders this image has not failed on; else any healthy one (a
  // failure may have been transient), still bounded by kMaxAttempts.
  const auto encoders = context_.instances->Healthy(Role::kEncoder);
  std::vector<std::string> ids;
  std::vector<std::shared_ptr<Instance>> usable;
  for (bool allow_failed : {false, true}) {
    for (const auto& e : encoders) {
      if (allow_failed || im.failed_encoders.count(e->id) == 0) {
        ids.push_back(e->id);
        usable.push_back(e);
      }
    }
    if (!usable.empty()) break;
  }
  size_t pick = scheduler::RendezvousPick(im.hash, ids);
  if (pick == scheduler::kNoCandidate) {
    return absl::UnavailableError(absl::StrCat("no healthy encoder for image ", k));
  }
  std::vector<uint64_t> queued;
  for (const auto& e : usable) queued.push_back(context_.instances->LastLoad(e->id).waiting());
  if (queued[pick] >= static_cast<uint64_t>(context_.options.encoder_saturation)) {
    pick = scheduler::LeastLoaded(queued);  // affinity yields to load
  }
  return usable[pick];
}

internal::v1::PromptImage EncoderDispatch::Describe(size_t k, const Instance& encoder) const {
  const Image& im = images_[k];
  internal::v1::PromptImage pi;
  pi.set_image_index(static_cast<uint32_t>(k));
  pi.mutable_content_hash()->set_high(im.hash.high);
  pi.mutable_content_hash()->set_low(im.hash.low);
  if (im.grid) {
    pi.set_num_tokens(static_cast<uint32_t>(im.grid->num_tokens()));
    pi.set_grid_t(static_cast<uint32_t>(im.grid->grid_t));
    pi.set_grid_h(static_cast<uint32_t>(im.grid->grid_h));
    pi.set_grid_w(static_cast<uint32_t>(im.grid->grid_w));
  }
  pi.set_encoder_id(encoder.id);
  pi.set_encoder_address(encoder.address);
  pi.set_transfer_id(im.transfer_id);
  if (im.video) pi.set_kind(internal::v1::MEDIA_KIND_VIDEO);
  for (const double t : im.timestamps) pi.add_timestamps(t);
  return pi;
}

std::optional<internal::v1::PromptImage> EncoderDispatch::ExpectCached(size_t k) {
  Image& im = images_[k];
  if (im.video || !im.grid) return std::nullopt;
  im.expected_cached = true;
  im.encoder_id.clear();
  im.transfer_id = absl::StrCat(request_.request_id(), "@kv");
  context_.metrics->encoder_skipped.Increment();
  internal::v1::PromptImage pi = Describe(k, Instance{});
  pi.set_expect_cached(true);
  return pi;
}

absl::StatusOr<std::vector<internal::v1::PromptImage>> EncoderDispatch::Dispatch(
    const std::vector<size_t>& images, DeferredActions& deferred, const OnEncoded& on_encoded) {
  std::vector<std::pair<size_t, std::shared_ptr<Instance>>> picks;
  for (size_t k : images) {
    ASSIGN_OR_RETURN(std::shared_ptr<Instance> enc, PickEncoder(k));
    picks.push_back({k, std::move(enc)});
  }
  return Start(picks, /*copy=*/false, deferred, on_encoded);
}

absl::StatusOr<std::vector<internal::v1::PromptImage>> EncoderDispatch::DispatchCopy(
    const std::vector<size_t>& images, DeferredActions& deferred, const OnEncoded& on_encoded) {
  std::vector<std::pair<size_t, std::shared_ptr<Instance>>> picks;
  std::vector<size_t> never_encoded;  // expected cached where the call ran
  for (size_t k : images) {
    if (k < images_.size() && images_[k].expected_cached) {
      never_encoded.push_back(k);
      continue;
    }
    std::shared_ptr<Instance> enc =
        k < images_.size() ? context_.instances->Get(images_[k].encoder_id) : nullptr;
    if (enc == nullptr) return absl::UnavailableError(absl::StrCat("no encoder for image ", k));
    picks.push_back({k, std::move(enc)});
  }
  ASSIGN_OR_RETURN(std::vector<internal::v1::PromptImage> described,
                   Start(picks, /*copy=*/true, deferred, on_encoded));
  if (never_encoded.empty()) return described;
  ASSIGN_OR_RETURN(std::vector<internal::v1::PromptImage> encoded,
                   Move(never_encoded, "", deferred, on_encoded));
  for (auto& d : encoded) described.push_back(std::move(d));
  std::sort(described.begin(), described.end(),
            [](const auto& a, const auto& b) { return a.image_index() < b.image_index(); });
  return described;
}

absl::StatusOr<std::vector<internal::v1::PromptImage>> EncoderDispatch::Start(
    const std::vector<std::pair<size_t, std::shared_ptr<Instance>>>& picks, bool copy,
    DeferredActions& deferred, const OnEncoded& on_encoded) {
  std::vector<internal::v1::PromptImage> described;
  std::map<std::string, std::unique_ptr<Encode>> by_encoder;
  for (const auto& [k, enc] : picks) {
    auto& encode = by_encoder[enc->id];
    if (encode == nullptr) {
      encode = std::make_unique<Encode>();
      encode->encoder_id = enc->id;
      encode->copy = copy;
      encode->request.set_request_id(
          absl::StrCat(request_.request_id(), "@", enc->id, "#", next_attempt_++));
      encode->request.set_model(context_.options.model_id);
    }
    encode->images.push_back(k);
    if (!copy) {
      images_[k].encoder_id = enc->id;
      images_[k].transfer_id = encode->request.request_id();
    }
    internal::v1::EncodeImage* ei = encode->request.add_images();
    ei->set_image_index(static_cast<uint32_t>(k));
    const MediaPart part = RequestMedia(request_)[k];
    if (part.video != nullptr) {
      *ei->mutable_video() = *part.video;
    } else {
      *ei->mutable_image() = *part.image;
    }
    ei->mutable_content_hash()->set_high(images_[k].hash.high);
    ei->mutable_content_hash()->set_low(images_[k].hash.low);
    described.push_back(Describe(k, *enc));
    described.back().set_transfer_id(encode->request.request_id());
  }
  for (auto& [eid, encode] : by_encoder) {
    std::shared_ptr<Instance> enc = context_.instances->Get(eid);
    if (enc == nullptr) continue;  // removed meanwhile: its down event re-dispatches
    encode->ctx.set_deadline(deadline_);
    Encode* raw = encode.get();
    encodes_.push_back(std::move(encode));
    deferred.Defer([enc, raw, on_encoded] {
      enc->encoder->async()->Encode(&raw->ctx, &raw->request, &raw->response,
                                    [raw, on_encoded](grpc::Status s) { on_encoded(raw, s); });
    });
  }
  return described;
}

absl::StatusOr<std::vector<internal::v1::PromptImage>> EncoderDispatch::Move(
    const std::vector<size_t>& images, const std::string& failed_encoder, DeferredActions& deferred,
    const OnEncoded& on_encoded) {
  for (size_t k : images) {
    images_[k].failed_encoders.insert(failed_encoder);
    if (images_[k].expected_cached) context_.metrics->encoder_skip_fallbacks.Increment();
    images_[k].expected_cached = false;
  }
  for (auto& e : encodes_) {
    if (!e->done && e->encoder_id == failed_encoder) {
      deferred.Defer([raw = e.get()] { raw->ctx.TryCancel(); });
    }
  }
  return Dispatch(images, deferred, on_encoded);
}

EncodeFailure EncoderDispatch::Answered(Encode* encode, const grpc::Status& status) {
  encode->done = true;
  EncodeFailure failure{encode->encoder_id, {}, encode->copy};
  if (encode->copy) return failure;  // its cache hits are the first copy's
  if (status.ok()) {
    for (const auto& e : encode->response.images()) cached_images_ += e.cache_hit() ? 1 : 0;
    return failure;
  }
  for (size_t k : encode->images) {
    if (images_[k].transfer_id == encode->request.request_id()) failure.images.push_back(k);
  }
  return failure;
}

bool EncoderDispatch::AllAnswered() const {
  for (const auto& e : encodes_) {
    if (!e->done) return false;
  }
  return true;
}

std::vector<size_t> EncoderDispatch::ImagesOn(const std::string& encoder_id) const {
  std::vector<size_t> out;
  for (size_t k = 0; k < images_.size(); ++k) {
    if (images_[k].encoder_id == encoder_id) out.push_back(k);
  }
  return out;
}

std::map<std::string, std::vector<size_t>> EncoderDispatch::Lost(
    const internal::v1::TokenBatch& batch) const {
  std::map<std::string, std::vector<size_t>> by_encoder;
  for (uint32_t k : batch.lost_images()) {
    if (k < images_.size() && images_[k].transfer_id == batch.lost_transfer_id()) {
      by_encoder[images_[k].encoder_id].push_back(k);
    }
  }
  return by_encoder;
}

void EncoderDispatch::CancelOpen(DeferredActions& deferred) {
  for (auto& e : encodes_) {
    if (!e->done) deferred.Defer([raw = e.get()] { raw->ctx.TryCancel(); });
  }
}

}  // namespace mmserve::router
