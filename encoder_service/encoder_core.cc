#include "encoder_service/encoder_core.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "model/image_preprocess.h"
#include "model/video_request.h"
#include "transfer/embedding_layout.h"

namespace mmserve::encoder {
namespace {

void ToProto(const ContentHash& h, mmserve::v1::ContentHash* out) {
  out->set_high(h.high);
  out->set_low(h.low);
}

}  // namespace

struct EncoderCore::Job {
  std::string request_id;
  std::string transfer_id;
  std::vector<EncodeJob::Image> images;
  EncodeDone done;
  std::atomic<bool> over{false};  // done ran (success, failure or cancel)
  absl::Mutex mu;
  v1::EncodeResponse response ABSL_GUARDED_BY(mu);
  size_t remaining ABSL_GUARDED_BY(mu) = 0;
};

EncoderCore::EncoderCore(const EncoderCoreOptions& options, transfer::TransferEngine& engine,
                         metrics::Registry& metrics)
    : options_(options), engine_(engine), metrics_(metrics), cache_(options.cache_bytes) {
  images_encoded_ = &metrics_.GetCounter("mmserve_encoder_images_encoded_total",
                                         "Images run through the vision tower.");
  cache_hits_ = &metrics_.GetCounter("mmserve_encoder_cache_hits_total",
                                     "Images whose embeddings came from the cache.");
  cache_misses_ = &metrics_.GetCounter("mmserve_encoder_cache_misses_total",
                                       "Images not found in the embedding cache.");
  coalesced_ = &metrics_.GetCounter(
      "mmserve_encoder_coalesced_total",
      "Images another request was encoding at the time (encoded once for both).");
  bad_images_ = &metrics_.GetCounter("mmserve_encoder_bad_images_total",
                                     "Images refused (undecodable, oversized, bad hash).");
  transfer_bytes_ = &metrics_.GetCounter("mmserve_encoder_transfer_bytes_total",
                                         "Embedding bytes of images whose transfer completed.");
  tower_seconds_ = &metrics_.GetHistogram(
      "mmserve_encoder_tower_seconds", "Vision tower time per batch.", metrics::LatencyBuckets());
  batch_images_ = &metrics_.GetHistogram(
      "mmserve_encoder_batch_images", "Images per vision tower batch.", {1, 2, 4, 8, 16, 32, 64});
  transfer_seconds_ = &metrics_.GetHistogram(
      "mmserve_encoder_transfer_seconds",
      "From publishing an image to its transfer's end (waiting for the receiver included).",
      metrics::LatencyBuckets());
}

EncoderCore::~EncoderCore() { Shutdown(); }

absl::StatusOr<std::unique_ptr<EncoderCore>> EncoderCore::Create(const EncoderCoreOptions& options,
                                                                 transfer::TransferEngine& engine,
                                                                 metrics::Registry& metrics) {
  std::unique_ptr<EncoderCore> core(new EncoderCore(options, engine, metrics));
  RETURN_IF_ERROR(core->Load());
  core->StartStages();
  return core;
}

void EncoderCore::StartStages() {
  decode_stage_ = std::make_unique<WorkerPool>(
      WorkerPoolOptions{.name = "encoder decode", .threads = options_.decode_threads});
  EventLoopOptions tower{.name = "encoder tower"};
  tower.step = [this](bool) { return TowerStep(); };
  tower.on_stop = EventLoopOptions::OnStop::kDrop;
  tower_stage_ = std::make_unique<MessageLoop<MediaWork>>(
      [this](MediaWork& w) { QueueForTower(w); }, std::move(tower));
  EventLoopOptions publish{.name = "encoder publish"};
  publish.on_stop = EventLoopOptions::OnStop::kDrop;
  publish_stage_ = std::make_unique<EventLoop>(std::move(publish));
}

absl::Status EncoderCore::Load() {
  ASSIGN_OR_RETURN(config_, model::LoadModelConfig(options_.model_dir));
  if (!config_.vision || !config_.preprocessor) {
    return absl::InvalidArgumentError(absl::StrCat(
        options_.model_dir, " is not a vision model (no vision_config or preprocessor_config)"));
  }
  ASSIGN_OR_RETURN(checkpoint_, model::SafetensorsCheckpoint::Open(options_.model_dir));
  model::VisionTowerOptions tower_options;
  ASSIGN_OR_RETURN(tower_options.int8_group, model::VisionInt8Group(options_.quantize));
  ASSIGN_OR_RETURN(const model::ActivationDtype activations,
                   model::ParseActivationDtype(options_.activation_dtype, options_.quantize));
  tower_options.bf16_activations = activations == model::ActivationDtype::kBf16;
  tower_options.int8_activations = activations == model::ActivationDtype::kInt8;
  ASSIGN_OR_RETURN(tower_, model::VisionTower::Load(*checkpoint_, config_, tower_options));
  // Each token's row: the main embedding and its DeepStack features.
  const int64_t row_width = int64_t{tower_->out_hidden()} * (1 + config_.DeepstackLevels());
  const transfer::EmbeddingLayout& layout = engine_.buffer().layout();
  if (layout.hidden_size != row_width || layout.dtype_bytes != sizeof(float)) {
    return absl::InvalidArgumentError(
        absl::StrCat("send buffer holds ", layout.hidden_size, " x ", layout.dtype_bytes,
                     "-byte values per token; the tower produces ", row_width, " floats"));
  }
  return absl::OkStatus();
}

void EncoderCore::Encode(EncodeJob request, EncodeDone done) {
  auto job = std::make_shared<Job>();
  job->request_id = std::move(request.request_id);
  job->transfer_id = std::move(request.transfer_id);
  job->images = std::move(request.images);
  job->done = std::move(done);
  const size_t n = job->images.size();
  for (size_t i = 0; i < n; ++i) {
    const EncodeJob::Image& image = job->images[i];
    const ContentHash actual =
        image.video != nullptr ? model::VideoContentHash(*image.video) : HashBytes(image.data);
    if (actual != image.hash) {
      bad_images_->Increment();
      EncodeDone d = std::move(job->done);
      d(absl::InvalidArgumentError(absl::StrCat(image.video != nullptr ? "video " : "image ",
                                                image.image_index,
                                                ": content hash does not match its bytes")));
      return;
    }
  }
  {
    absl::MutexLock lock(&job->mu);
    job->remaining = n;
    for (size_t i = 0; i < n; ++i) {
      v1::EncodedImage* e = job->response.add_images();
      e->set_image_index(job->images[i].image_index);
      ToProto(job->images[i].hash, e->mutable_content_hash());
    }
  }
  if (n == 0) {
    job->over = true;
    EncodeDone d = std::move(job->done);
    d(v1::EncodeResponse());
    return;
  }
  pending_ += n;
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      for (size_t i = 0; i < n; ++i) {
        const ContentHash& hash = job->images[i].hash;
        Work w{{job, i}, cache_.Lookup(hash)};
        auto inflight = inflight_.find(hash);
        if (w.encoded != nullptr || inflight != inflight_.end()) {
          {
            absl::MutexLock jl(&job->mu);
            job->response.mutable_images(static_cast<int>(i))->set_cache_hit(true);
          }
          if (w.encoded != nullptr) {
            cache_hits_->Increment();
            publish_queue_.push_back(std::move(w));
            publish_stage_->Post([this] { PublishNext(); });
          } else {
            coalesced_->Increment();
            inflight->second.push_back(std::move(w.waiter));
          }
        } else {
          cache_misses_->Increment();
          inflight_[hash].push_back(std::move(w.waiter));
          MediaWork work{.hash = hash, .data = job->images[i].data, .video = job->images[i].video};
          decode_stage_->Post(
              [this, work = std::move(work)]() mutable { Decode(std::move(work)); });
        }
      }
      return;
    }
  }
  pending_ -= n;
  job->over = true;
  job->done(absl::CancelledError("the encoder is shutting down"));
}

void EncoderCore::Cancel(const std::string& transfer_id) {
  std::vector<Waiter> dropped;
  {
    absl::MutexLock lock(&mu_);
    // Images in the pipeline keep going while someone else waits for them
    // (the pipeline drops the rest when they reach the next stage).
    for (auto& [hash, waiters] : inflight_) {
      for (auto it = waiters.begin(); it != waiters.end();) {
        if (it->job->transfer_id == transfer_id) {
          dropped.push_back(std::move(*it));
          it = waiters.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto it = publish_queue_.begin(); it != publish_queue_.end();) {
      if (it->waiter.job->transfer_id == transfer_id) {
        dropped.push_back(std::move(it->waiter));
        it = publish_queue_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Waiter& w : dropped) Complete(w.job, w.slot, absl::CancelledError("cancelled"));
}

std::vector<EncoderCore::Waiter> EncoderCore::TakeWaiters(const ContentHash& hash) {
  absl::MutexLock lock(&mu_);
  auto it = inflight_.find(hash);
  if (it == inflight_.end()) return {};
  std::vector<Waiter> out = std::move(it->second);
  inflight_.erase(it);
  return out;
}

bool EncoderCore::Wanted(const ContentHash& hash) {
  absl::MutexLock lock(&mu_);
  auto it = inflight_.find(hash);
  if (it == inflight_.end()) return false;
  for (const Waiter& w : it->second) {
    if (!w.job->over) return true;
  }
  return false;
}

void EncoderCore::Shutdown() {
  std::vector<Waiter> dropped;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [hash, waiters] : inflight_) {
      for (Waiter& w : waiters) dropped.push_back(std::move(w));
    }
    inflight_.clear();
    for (Work& w : publish_queue_) dropped.push_back(std::move(w.waiter));
    publish_queue_.clear();
  }
  for (Waiter& w : dropped) {
    Complete(w.job, w.slot, absl::CancelledError("the encoder is shutting down"));
  }
  // Queued images are dropped; the ones in a stage finish it and find
  // nobody waiting. Null when Load failed.
  if (decode_stage_ != nullptr) decode_stage_->Stop();
  if (tower_stage_ != nullptr) tower_stage_->Stop();
  if (publish_stage_ != nullptr) publish_stage_->Stop();
}

void EncoderCore::Complete(const std::shared_ptr<Job>& job, size_t slot, absl::Status status) {
  --pending_;
  EncodeDone done;
  absl::StatusOr<v1::EncodeResponse> result;
  {
    absl::MutexLock lock(&job->mu);
    if (job->over) return;
    if (!status.ok()) {
      result = std::move(status);
    } else if (--job->remaining == 0) {
      result = job->response;
    } else {
      return;
    }
    job->over = true;
    done = std::move(job->done);
  }
  done(std::move(result));
}

absl::StatusOr<model::ImagePatches> EncoderCore::Preprocess(const MediaWork& w) const {
  if (w.video != nullptr) {
    ASSIGN_OR_RETURN(model::ImagePatches p,
                     model::LoadVideo(*w.video, *config_.preprocessor, options_.video_limits,
                                      options_.decode_limits));
    p.grid.time_step = config_.VideoTimeStep(
        w.video->has_fps() ? std::optional<double>(w.video->fps()) : std::nullopt);
    return p;
  }
  ASSIGN_OR_RETURN(const model::RgbImage rgb, model::DecodeImage(w.data, options_.decode_limits));
  return model::PreprocessImage(rgb, *config_.preprocessor);
}

void EncoderCore::Decode(MediaWork w) {
  if (!Wanted(w.hash)) {
    for (Waiter& x : TakeWaiters(w.hash)) Complete(x.job, x.slot, absl::CancelledError("over"));
    return;
  }
  absl::StatusOr<model::ImagePatches> patches = Preprocess(w);
  if (!patches.ok()) {
    for (Waiter& x : TakeWaiters(w.hash)) {
      bad_images_->Increment();
      Complete(x.job, x.slot,
               absl::InvalidArgumentError(absl::StrCat(
                   w.video != nullptr ? "video " : "image ", x.job->images[x.slot].image_index,
                   ": ", absl::StripPrefix(patches.status().message(), "video: "))));
    }
    return;
  }
  w.patches = std::move(*patches);
  w.data.clear();
  // Refused only once stopping: then nobody waits for it.
  (void)tower_stage_->Post(std::move(w));
}

void EncoderCore::QueueForTower(MediaWork& w) { tower_queue_.push_back(std::move(w)); }

bool EncoderCore::FrontWanted() {
  MediaWork& w = tower_queue_.front();
  if (Wanted(w.hash)) return true;
  for (Waiter& x : TakeWaiters(w.hash)) Complete(x.job, x.slot, absl::CancelledError("over"));
  tower_queue_.pop_front();
  return false;
}

Deadline EncoderCore::TowerStep() {
  // One batch of the queue's oldest images under the patch budget (at least
  // one image, or one temporal patch of a video); a video over the rest of
  // the budget runs its first whole temporal patches now and stays in front
  // for the next batches. The loop calls again at once while work remains.
  std::deque<MediaWork> whole;  // works done in this batch (stable references)
  std::vector<Slice> slices;
  int64_t patches = 0;
  while (!tower_queue_.empty()) {
    if (!FrontWanted()) continue;
    MediaWork& w = tower_queue_.front();
    const model::MediaGrid& g = w.patches.grid;
    const int64_t per_t = int64_t{g.grid_h} * g.grid_w;
    const int left = g.grid_t - w.t_done;
    int take = left;
    if (patches + per_t * left > options_.max_batch_patches) {
      take =
          static_cast<int>(std::min<int64_t>(left, (options_.max_batch_patches - patches) / per_t));
      if (slices.empty()) take = std::max(take, 1);
      if (take <= 0) break;
    }
    patches += per_t * take;
    if (take < left) {
      slices.push_back({&w, w.t_done, take});
      break;
    }
    whole.push_back(std::move(w));
    tower_queue_.pop_front();
    slices.push_back({&whole.back(), whole.back().t_done, take});
  }
  if (!slices.empty()) {
    if (RunBatch(slices)) {
      for (MediaWork& w : whole) Finish(w);
    } else if (!tower_queue_.empty() && slices.back().work == &tower_queue_.front()) {
      tower_queue_.pop_front();  // a failed piece: its waiters got the error
    }
  }
  return tower_queue_.empty() ? Deadline::Never() : Deadline::After(absl::ZeroDuration());
}

bool EncoderCore::RunBatch(const std::vector<Slice>& slices) {
  std::vector<float> pixels;
  std::vector<model::MediaGrid> grids;
  for (const Slice& s : slices) {
    const model::ImagePatches& p = s.work->patches;
    const size_t per_t = static_cast<size_t>(p.grid.grid_h) * p.grid.grid_w * p.patch_dim;
    pixels.insert(pixels.end(), p.values.begin() + s.t_first * per_t,
                  p.values.begin() + (s.t_first + s.t_count) * per_t);
    model::MediaGrid g = p.grid;
    g.grid_t = s.t_count;
    grids.push_back(g);
  }
  Stopwatch clock;
  absl::StatusOr<model::VisionEmbeddings> all = tower_->ForwardAll(pixels, grids);
  absl::StatusOr<std::vector<float>> out =
      all.ok() ? model::TokenRows(std::move(*all), tower_->out_hidden())
               : absl::StatusOr<std::vector<float>>(all.status());
  tower_seconds_->Observe(clock.ElapsedSeconds());
  batch_images_->Observe(static_cast<double>(slices.size()));
  if (!out.ok()) {
    for (const Slice& s : slices) {
      for (Waiter& x : TakeWaiters(s.work->hash)) Complete(x.job, x.slot, out.status());
    }
    return false;
  }
  const size_t hidden = engine_.buffer().layout().hidden_size;  // the row's floats
  size_t row = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    const size_t rows = static_cast<size_t>(grids[i].num_tokens());
    std::vector<float>& e = slices[i].work->embedding;
    e.insert(e.end(), out->begin() + row * hidden, out->begin() + (row + rows) * hidden);
    row += rows;
    slices[i].work->t_done += slices[i].t_count;
  }
  return true;
}

void EncoderCore::Finish(MediaWork& w) {
  auto encoded = std::make_shared<EncodedMedia>();
  encoded->grid = w.patches.grid;
  encoded->embedding = std::move(w.embedding);
  images_encoded_->Increment();
  cache_.Insert(w.hash, encoded);
  // The cache holds it now; whoever asked meanwhile publishes it.
  std::vector<Work> works;
  for (Waiter& x : TakeWaiters(w.hash)) works.push_back(Work{std::move(x), encoded});
  QueueForPublish(std::move(works));
}

void EncoderCore::QueueForPublish(std::vector<Work> works) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      for (Work& w : works) {
        publish_queue_.push_back(std::move(w));
        publish_stage_->Post([this] { PublishNext(); });
      }
      return;
    }
  }
  // Shutdown took the waiters it could see; these left inflight_ before.
  for (Work& w : works) {
    Complete(w.waiter.job, w.waiter.slot, absl::CancelledError("the encoder is shutting down"));
  }
}

void EncoderCore::PublishNext() {
  Work w;
  {
    absl::MutexLock lock(&mu_);
    if (publish_queue_.empty()) return;  // Cancel or Shutdown took it
    w = std::move(publish_queue_.front());
    publish_queue_.pop_front();
  }
  Publish(w);
}

void EncoderCore::Publish(Work& w) {
  if (options_.test_only_publish_delay > absl::ZeroDuration()) {
    absl::SleepFor(options_.test_only_publish_delay);
  }
  if (w.waiter.job->over) {
    Complete(w.waiter.job, w.waiter.slot, absl::CancelledError("job over"));
    return;
  }
  const EncodedMedia& e = *w.encoded;
  const EncodeJob::Image& image = w.waiter.job->images[w.waiter.slot];
  const uint32_t n = static_cast<uint32_t>(e.grid.num_tokens());
  transfer::BlockAllocator& allocator = engine_.allocator();
  absl::StatusOr<transfer::BlockAllocation> blocks =
      allocator.AllocWait(n, w.waiter.job->transfer_id, Deadline::After(options_.block_wait));
  if (!blocks.ok()) {
    Complete(
        w.waiter.job, w.waiter.slot,
        absl::ResourceExhaustedError(absl::StrCat(
            "image ", image.image_index, ": no send buffer blocks: ", blocks.status().message())));
    return;
  }
  const int merge = e.grid.merge_size;
  const transfer::MediaRowsHeader header{
      .image_index = image.image_index,
      .fill_id = transfer::ImageFillId(image.hash.low),
      .grid = {.t = e.grid.grid_t,
               .rows = e.grid.grid_h / merge,
               .cols = e.grid.grid_w / merge,
               .time_step = e.grid.time_step},
      .sections = static_cast<uint32_t>(1 + config_.DeepstackLevels())};
  transfer::EmbeddingBuffer& buffer = engine_.buffer();
  // Load checked a float buffer of the tower's width and AllocWait gave n
  // tokens: a failure would be the encoder's own bug.
  CHECK_OK(transfer::EncodeImage(header, e.embedding, *blocks, buffer));
  {
    absl::MutexLock lock(&w.waiter.job->mu);
    v1::EncodedImage* out = w.waiter.job->response.mutable_images(static_cast<int>(w.waiter.slot));
    out->set_num_tokens(n);
    out->set_grid_t(e.grid.grid_t);
    out->set_grid_h(e.grid.grid_h);
    out->set_grid_w(e.grid.grid_w);
  }
  const size_t bytes = size_t{n} * buffer.layout().BytesPerToken();
  auto started = std::make_shared<Stopwatch>();
  // The engine runs this when the transfer ends, which can be after this core
  // is gone (Shutdown does not wait for published transfers): it touches only
  // the metrics, which the registry owns and which outlive the engine.
  engine_.Publish(
      {.request_id = w.waiter.job->transfer_id,
       .image_index = image.image_index,
       .blocks = *blocks,
       .keep_for = options_.keep_for},
      [seconds = transfer_seconds_, total = transfer_bytes_, bytes, started](absl::Status s) {
        seconds->Observe(started->ElapsedSeconds());
        if (s.ok()) total->Increment(static_cast<double>(bytes));
      });
  Complete(w.waiter.job, w.waiter.slot, absl::OkStatus());
}

}  // namespace mmserve::encoder
