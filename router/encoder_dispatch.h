// The images of one Generate call and the Encode calls that carry them to
// encoders; shared by both call kinds. Each image goes to an encoder by
// rendezvous hashing of its content hash over the healthy encoders it has
// not failed on (cache affinity), to the least queued one when that encoder
// is saturated; an image whose encoder fails moves to another, a new
// attempt with a new transfer id, at most kMaxAttempts times. A transfer
// has one receiver: an elastic group's other members get copies (DispatchCopy),
// each its own Encode call and transfer id on the image's encoder.
//
//   EncoderDispatch encoders(context, request, deadline, prepared_images);
//   ASSIGN_OR_RETURN(auto described, encoders.Dispatch(all, deferred, on_encoded));
//   ... // prefill.images = described
//   EncodeFailure f = encoders.Answered(encode, status);  // from on_encoded
//
// Not thread-safe: the owning call serializes every use under its mutex.
// Encode calls start, and are cancelled, through the call's DeferredActions,
// and report to `on_encoded` on gRPC's threads.
#ifndef MMSERVE_ROUTER_ENCODER_DISPATCH_H_
#define MMSERVE_ROUTER_ENCODER_DISPATCH_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/hash.h"
#include "model/image_tokens.h"
#include "proto/inference.pb.h"
#include "proto/language.pb.h"
#include "router/deferred_actions.h"
#include "router/instance_table.h"
#include "router/request_validation.h"
#include "router/router_context.h"

namespace mmserve::router {

// An encoder's failure as the call sees it: the images of the failed
// attempt whose current source it still is (those to move elsewhere).
struct EncodeFailure {
  std::string encoder_id;
  std::vector<size_t> images;
  bool copy = false;  // a copy's call (DispatchCopy): nothing moves, the call fails
};

class EncoderDispatch {
 public:
  static constexpr int kMaxAttempts = 3;

  struct Encode;  // one Encode call
  using OnEncoded = std::function<void(Encode*, const grpc::Status&)>;

  // `context` and `request` (whose images it sends) must outlive it.
  EncoderDispatch(const RouterContext& context, const mmserve::v1::GenerateRequest& request,
                  std::chrono::system_clock::time_point deadline,
                  const std::vector<PreparedMedia>& images);
  ~EncoderDispatch();
  EncoderDispatch(const EncoderDispatch&) = delete;
  EncoderDispatch& operator=(const EncoderDispatch&) = delete;

  size_t size() const { return images_.size(); }
  // Starts Encode calls for `images` (a new attempt each) and returns their
  // language-side descriptors; UNAVAILABLE when an image has no healthy
  // encoder or has been tried kMaxAttempts times.
  [[nodiscard]] absl::StatusOr<std::vector<internal::v1::PromptImage>> Dispatch(
      const std::vector<size_t>& images, DeferredActions& deferred, const OnEncoded& on_encoded);
  // The same images again for another receiver (an elastic group member past
  // the first; a transfer has one receiver): new Encode calls and transfer
  // ids on each image's current encoder, where its embedding is cached.
  // Copies neither move on failure (Answered says `copy`) nor count as
  // cache hits; UNAVAILABLE when an image's encoder is gone.
  [[nodiscard]] absl::StatusOr<std::vector<internal::v1::PromptImage>> DispatchCopy(
      const std::vector<size_t>& images, DeferredActions& deferred, const OnEncoded& on_encoded);
  // `images` failed on `failed_encoder`: they avoid it from now on, calls
  // still open to it are cancelled (they would only hold the final response
  // back until their deadline), and they are dispatched again.
  [[nodiscard]] absl::StatusOr<std::vector<internal::v1::PromptImage>> Move(
      const std::vector<size_t>& images, const std::string& failed_encoder,
      DeferredActions& deferred, const OnEncoded& on_encoded);

  // Image `k` goes to no encoder: the language instance is expected to hold
  // its KV (PromptImage.expect_cached, with transfer id "<request>@kv"). Its
  // descriptor, or nullopt for a video or an image not pre-sized (the
  // language side needs its grid), which must be dispatched. A lost report
  // of it later (Lost, under its own encoder id "") moves it to an encoder
  // (Move), as does a copy for a migration (DispatchCopy); each counts as a
  // fallback.
  std::optional<internal::v1::PromptImage> ExpectCached(size_t k);

  // Records the answer of `encode` (cache hits when OK); what moves if it
  // failed.
  EncodeFailure Answered(Encode* encode, const grpc::Status& status);
  // Whether every Encode call has answered.
  bool AllAnswered() const;
  uint32_t cached_images() const { return cached_images_; }

  // The images currently sourced from `encoder_id`.
  std::vector<size_t> ImagesOn(const std::string& encoder_id) const;
  // The images a TokenBatch reports lost, by their current encoder; a report
  // about a source already replaced is stale and dropped.
  std::map<std::string, std::vector<size_t>> Lost(const internal::v1::TokenBatch& batch) const;

  // Cancels every Encode call that has not answered.
  void CancelOpen(DeferredActions& deferred);

 private:
  struct Image {
    ContentHash hash;
    std::optional<model::MediaGrid> grid;  // when pre-sized
    bool video = false;
    std::vector<double> timestamps;  // a Qwen3-VL video's
    std::string encoder_id;          // current source
    std::string transfer_id;
    int attempts = 0;
    std::set<std::string> failed_encoders;
    bool expected_cached = false;  // ExpectCached, until it moves to an encoder
  };

  // The encoder for image `k`, or UNAVAILABLE.
  absl::StatusOr<std::shared_ptr<Instance>> PickEncoder(size_t k);
  internal::v1::PromptImage Describe(size_t k, const Instance& encoder) const;
  // Encode calls for image k on picks[k]'s encoder, grouped by encoder.
  absl::StatusOr<std::vector<internal::v1::PromptImage>> Start(
      const std::vector<std::pair<size_t, std::shared_ptr<Instance>>>& picks, bool copy,
      DeferredActions& deferred, const OnEncoded& on_encoded);

  const RouterContext& context_;
  const mmserve::v1::GenerateRequest& request_;
  const std::chrono::system_clock::time_point deadline_;
  std::vector<Image> images_;
  std::vector<std::unique_ptr<Encode>> encodes_;
  int next_attempt_ = 1;
  uint32_t cached_images_ = 0;
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_ENCODER_DISPATCH_H_
