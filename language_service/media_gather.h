// A request's images, from their encoders to its engine request. Per
// image: connect to its encoder (once per encoder, on the gather's connector
// thread), receive its embedding over UCX (exact allocation when the router
// pre-sized it, else default-then-resume), derive its grid from the M-RoPE
// section, check its section header (the main embedding and each
// DeepStack feature side by side in a token's row), free the blocks (or,
// MmHandoff::kAsync, keep them for the request's steps to read in place). The loop never blocks on
// a transfer: results come back through Hooks::post. When an image's source fails (lost peer,
// deadline, corrupt data), the request's stream reports the lost images (TokenBatch.lost_images)
// and it waits up to lost_image_timeout for a retry with new sources (ApplyRetry; one that
// overtakes its request is kept, KeepEarly, and applied by Start).
//
//   MediaGather images(options, transfer, metrics,
//                      {.post = ..., .find = ..., .on_ready = admit});
//   images.Start(request);  // on the loop thread; on_ready once all arrived
//
// KeepEarly is thread-safe; everything else is the owner's loop thread's.
#ifndef MMSERVE_LANGUAGE_SERVICE_MEDIA_GATHER_H_
#define MMSERVE_LANGUAGE_SERVICE_MEDIA_GATHER_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "language_service/language_metrics.h"
#include "language_service/request_table.h"
#include "transfer/transfer_engine.h"

namespace mmserve::language {

// Seed 000: how an arrived image embedding reaches the model (and, with
// tensor parallelism, every rank).
enum class MmHandoff {
  // Read in place: the request keeps the receive-buffer blocks the
  // embedding arrived in until it ends, and a step names its rows by offset
  // (the buffer is memory every rank maps: engine.shared_input). Images that
  // arrived in several chunks are copied as kBlocking does.
  kAsync,
  // Copied: the loop copies each embedding out of the receive buffer when
  // it arrives and rank 0 copies its rows into every step that uses them
  // (the baseline mm_handoff_bench measures against).
  kBlocking,
};

struct MediaGatherOptions {
  std::string name;  // of the connector thread
  MmHandoff mm_handoff = MmHandoff::kAsync;
  absl::Duration transfer_timeout = absl::Seconds(30);
  absl::Duration lost_image_timeout = absl::Seconds(10);
  absl::Duration connect_timeout = absl::Seconds(3);
  int spatial_merge_size = 2;  // the model's: an embedding's grid from its M-RoPE section
  // The model's DeepStack features per token: an embedding must carry
  // 1 + deepstack_levels sections (transfer/embedding_layout.h).
  int deepstack_levels = 0;
};

class MediaGather {
 public:
  // What the gather needs of its owner.
  struct Hooks {
    // Any thread: queues `task` for the loop thread (never runs it inline);
    // false once stopping.
    std::function<bool(absl::AnyInvocable<void()> task)> post;
    // Loop thread: the live request of `id`; null once it ended.
    std::function<LiveRequest*(const std::string& id)> find;
    // Loop thread: every image of `r` arrived, its embeddings moved into its
    // engine request.
    std::function<void(LiveRequest& r)> on_ready;
  };

  // `transfer` and `metrics` must outlive the gather.
  MediaGather(const MediaGatherOptions& options, transfer::TransferEngine& transfer,
              LanguageMetrics& metrics, Hooks hooks);
  ~MediaGather();
  MediaGather(const MediaGather&) = delete;
  MediaGather& operator=(const MediaGather&) = delete;

  // Keeps a retry whose request is not here yet (for lost_image_timeout).
  void KeepEarly(const v1::ImageRetry& retry);
  // Starts a new request's images and applies its early retries; on_ready
  // at once when it has none.
  void Start(LiveRequest& r);
  // New sources for images of `r` (lost ones, or ones the router moved).
  void ApplyRetry(LiveRequest& r, const v1::ImageRetry& retry);
  // The engine did not find the KV of `r`'s images expected cached
  // (PromptImage.expect_cached), `why`: their embeddings come from encoders
  // after all. The rows already given to r.engine_request go back to their
  // images and those images are reported lost (the router sends each to an
  // encoder and retries). Returns how many.
  int LoseCached(LiveRequest& r, const absl::Status& why);
  // Cancels `r`'s transfers under way (it ends with `why`).
  void Cancel(const LiveRequest& r, const absl::Status& why);
  // Stops the connector thread (before the owner's loop goes). Idempotent.
  void Stop();

 private:
  struct Connection {
    std::string address;
    enum class State { kNone, kConnecting, kConnected } state = State::kNone;
    // (request id, image) waiting for the connection.
    std::vector<std::pair<std::string, size_t>> waiting;
  };

  void StartImage(LiveRequest& r, size_t k);
  void StartReceive(LiveRequest& r, size_t k);
  // The connector thread: connects to an encoder, then tells the loop.
  void Connect(const std::string& encoder, const std::string& address);
  void OnConnected(const std::string& encoder, const std::string& address, absl::Status status);
  void OnImage(const std::string& id, size_t k, const std::string& transfer_id,
               absl::StatusOr<transfer::ReceivedMedia> image);
  void LoseImages(LiveRequest& r, const std::string& transfer_id, const absl::Status& why);
  void MaybeReady(LiveRequest& r);

  const MediaGatherOptions options_;
  transfer::TransferEngine& transfer_;
  LanguageMetrics& metrics_;
  const Hooks hooks_;
  absl::Mutex mu_;
  // Retries that arrived before their request, oldest first, with expiry.
  std::deque<std::pair<v1::ImageRetry, Deadline>> early_retries_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Connection>> connections_;  // loop thread
  std::unique_ptr<EventLoop> connector_;  // last: encoder Connect calls, one at a time
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_MEDIA_GATHER_H_
