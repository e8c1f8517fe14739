// The encoder's work: images in, embeddings published for transfer out.
//
//   ASSIGN_OR_RETURN(auto core, EncoderCore::Create(options, engine, registry));
//   core->Encode({.request_id = "r1", .transfer_id = "r1@encoder-0#1", .images = {...}},
//                [](absl::StatusOr<v1::EncodeResponse> r) { ... });
//
// Videos (EncodeJob::Image::video) take the same path: decoded, sampled and
// preprocessed in stage 2 (model/video_request.h), run by the tower with
// their (t, h, w) grid, split across batches by whole temporal patches when
// they exceed the budget, cached under their content hash (which covers the
// sampling options) and published as images are.
//
// Each image flows through three stages, each on its own threads so that no
// gRPC thread ever decodes or runs the tower (common/ loops: a WorkerPool for
// decode, whose images are independent; an EventLoop each for the tower,
// which owns its queue and batches it, and the publisher):
//   1. cache lookup (caller's thread; a hit skips 2 and 3, and so does an
//      image another request is encoding right now: it waits for that one),
//   2. decode + preprocess on `decode_threads` workers,
//   3. the vision tower on one thread, over batches of queued images from any
//      requests under a patch budget (`max_batch_patches`),
// then the publisher copies the embedding into send-buffer blocks (waiting
// for blocks when the buffer is full: backpressure) and offers it to the
// transfer engine under the job's transfer id. `done` runs once, when every
// image of the job is published or the first one failed (INVALID_ARGUMENT
// with the decoder's reason for a bad image, RESOURCE_EXHAUSTED when no send
// blocks freed up in time, CANCELLED after Cancel or shutdown). Published
// images are dropped by the transfer engine if no receiver takes them within
// `keep_for`. Thread-safe.
#ifndef MMSERVE_ENCODER_SERVICE_ENCODER_CORE_H_
#define MMSERVE_ENCODER_SERVICE_ENCODER_CORE_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "common/hash.h"
#include "common/metrics.h"
#include "common/worker_pool.h"
#include "encoder_service/embedding_cache.h"
#include "model/image_decode.h"
#include "model/image_preprocess.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/video_decode.h"
#include "model/vision_tower.h"
#include "proto/common.pb.h"
#include "proto/encoder.pb.h"
#include "transfer/transfer_engine.h"

namespace mmserve::encoder {

namespace v1 = ::mmserve::internal::v1;

struct EncoderCoreOptions {
  std::string model_dir;
  int decode_threads = 1;
  // Patches the tower takes in one forward (at least one image per batch).
  int64_t max_batch_patches = 16384;
  // The tower's weights: "" (as stored), "int8" or "int8_g32" (quantized at
  // load, see model::VisionTowerOptions::int8_group).
  std::string quantize;
  // The tower's activations: "" or "f32", "bf16"
  // (model::VisionTowerOptions::bf16_activations) or "int8" (with int8
  // weights: model::VisionTowerOptions::int8_activations); see
  // model::ParseActivationDtype for what is refused.
  std::string activation_dtype;
  size_t cache_bytes = size_t{256} << 20;
  model::DecodeLimits decode_limits;
  model::VideoLimits video_limits;
  // How long a published image waits for its receiver.
  absl::Duration keep_for = absl::Seconds(30);
  // How long publishing waits for send-buffer blocks.
  absl::Duration block_wait = absl::Seconds(30);
  // Test only (the slow-encoder tests and mm_handoff_bench): each image
  // waits this long before it is published, as if the tower were slow. It
  // delays only the publish thread; 0 in production.
  absl::Duration test_only_publish_delay = absl::ZeroDuration();
};

struct EncodeJob {
  std::string request_id;
  // Request id the images are published (and transferred) under.
  std::string transfer_id;
  struct Image {
    uint32_t image_index = 0;
    std::string data;
    // For an image, XXH3-128 of `data`; for a video,
    // model::VideoContentHash(*video).
    ContentHash hash;
    // Set for a video (then `data` is empty): the clip and its options.
    std::shared_ptr<const mmserve::v1::Video> video;
  };
  std::vector<Image> images;
};

using EncodeDone = std::function<void(absl::StatusOr<v1::EncodeResponse>)>;

class EncoderCore {
 public:
  // `engine` and `metrics` must outlive the core, and `metrics` the engine
  // too: a published transfer reports its time to it when it ends.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<EncoderCore>> Create(
      const EncoderCoreOptions& options, transfer::TransferEngine& engine,
      metrics::Registry& metrics);
  ~EncoderCore();
  EncoderCore(const EncoderCore&) = delete;
  EncoderCore& operator=(const EncoderCore&) = delete;

  // Validates (hashes match the bytes) and queues the job; never blocks.
  void Encode(EncodeJob job, EncodeDone done);
  // Stops a job's images that have not been published yet (done gets
  // CANCELLED). Published ones are the transfer engine's to drop.
  void Cancel(const std::string& transfer_id);
  // Fails queued work with CANCELLED and joins the threads.
  void Shutdown();

  const model::ModelConfig& config() const { return config_; }
  // Floats per embedding token: the language model's hidden size, times
  // 1 + DeepStack levels (ModelConfig::EmbeddingRowWidth).
  int hidden_size() const { return tower_->out_hidden() * (1 + config_.DeepstackLevels()); }
  // Images queued or in a stage, and the embedding cache.
  size_t num_pending() const { return pending_.load(); }
  EmbeddingCache::Stats cache_stats() const { return cache_.stats(); }

 private:
  struct Job;
  // One image of one job, waiting for its embedding or being published.
  struct Waiter {
    std::shared_ptr<Job> job;
    size_t slot = 0;  // index into the job's images
  };
  // One distinct image (by content hash) in the decode/tower pipeline, with
  // every job slot that asked for it meanwhile (concurrent requests for the
  // same image are encoded once).
  struct MediaWork {
    ContentHash hash;
    std::string data;
    std::shared_ptr<const mmserve::v1::Video> video;
    model::ImagePatches patches;
    // A video larger than the patch budget runs in several tower batches,
    // whole temporal patches each (the tower attends within one temporal
    // patch, so the pieces give the whole's rows): how many ran, and their
    // rows so far.
    int t_done = 0;
    std::vector<float> embedding;
  };
  // Temporal patches [t_first, t_first + t_count) of a work in a batch.
  struct Slice {
    MediaWork* work = nullptr;
    int t_first = 0;
    int t_count = 0;
  };
  struct Work {
    Waiter waiter;
    std::shared_ptr<const EncodedMedia> encoded;
  };

  EncoderCore(const EncoderCoreOptions& options, transfer::TransferEngine& engine,
              metrics::Registry& metrics);
  absl::Status Load();
  void StartStages();
  // Decode stage, on a pool thread.
  void Decode(MediaWork w);
  absl::StatusOr<model::ImagePatches> Preprocess(const MediaWork& w) const;
  // Tower loop: queues an image; the step hook runs one batch of the queue.
  void QueueForTower(MediaWork& w);
  Deadline TowerStep();
  // Whether the queue's front is still wanted (else it is dropped).
  bool FrontWanted();
  // False when the tower failed (every slice's waiters then got the error).
  bool RunBatch(const std::vector<Slice>& slices);
  // A work whose last temporal patch ran: cached and queued for publishing.
  void Finish(MediaWork& w);
  // Queues images for the publisher, or cancels them once stopping.
  void QueueForPublish(std::vector<Work> works) ABSL_LOCKS_EXCLUDED(mu_);
  // Publish loop: publishes the oldest queued image (if Cancel left one).
  void PublishNext();
  void Publish(Work& work);
  // Takes the waiters of an image leaving the pipeline.
  std::vector<Waiter> TakeWaiters(const ContentHash& hash) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether anyone still waits for the image (else the pipeline drops it).
  bool Wanted(const ContentHash& hash) ABSL_LOCKS_EXCLUDED(mu_);
  // Records one image's outcome; runs done when the job is complete.
  void Complete(const std::shared_ptr<Job>& job, size_t slot, absl::Status status);

  const EncoderCoreOptions options_;
  transfer::TransferEngine& engine_;
  metrics::Registry& metrics_;
  model::ModelConfig config_;
  std::unique_ptr<model::SafetensorsCheckpoint> checkpoint_;
  std::unique_ptr<model::VisionTower> tower_;
  EmbeddingCache cache_;
  std::atomic<size_t> pending_{0};

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Cancel takes images out of it; one publish task per image queued.
  std::deque<Work> publish_queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ContentHash, std::vector<Waiter>> inflight_ ABSL_GUARDED_BY(mu_);
  std::deque<MediaWork> tower_queue_;  // tower loop thread only

  metrics::Counter* images_encoded_;
  metrics::Counter* cache_hits_;
  metrics::Counter* cache_misses_;
  metrics::Counter* coalesced_;
  metrics::Counter* bad_images_;
  metrics::Counter* transfer_bytes_;
  metrics::Histogram* tower_seconds_;
  metrics::Histogram* batch_images_;
  metrics::Histogram* transfer_seconds_;

  // Last: their threads stop before the state they use goes.
  std::unique_ptr<WorkerPool> decode_stage_;
  std::unique_ptr<MessageLoop<MediaWork>> tower_stage_;
  std::unique_ptr<EventLoop> publish_stage_;
};

}  // namespace mmserve::encoder

#endif  // MMSERVE_ENCODER_SERVICE_ENCODER_CORE_H_
