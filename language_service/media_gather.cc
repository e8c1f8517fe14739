#include "language_service/media_gather.h"

#include <time.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/logging.h"
#include "model/chat_template.h"
#include "proto/encoder.grpc.pb.h"
#include "transfer/embedding_layout.h"

namespace mmserve::language {
namespace {

// CPU time of the calling thread: what the work cost the loop, without the
// time the thread was descheduled (these machines are shared).
int64_t ThreadCpuNanos() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

MediaGather::MediaGather(const MediaGatherOptions& options, transfer::TransferEngine& transfer,
                         LanguageMetrics& metrics, Hooks hooks)
    : options_(options),
      transfer_(transfer),
      metrics_(metrics),
      hooks_(std::move(hooks)),
      connector_(std::make_unique<EventLoop>(EventLoopOptions{
          .name = options.name + "-connect", .on_stop = EventLoopOptions::OnStop::kDrop})) {}

MediaGather::~MediaGather() { Stop(); }

void MediaGather::Stop() { connector_->Stop(); }

void MediaGather::KeepEarly(const v1::ImageRetry& retry) {
  absl::MutexLock lock(&mu_);
  early_retries_.push_back({retry, Deadline::After(options_.lost_image_timeout)});
  while (!early_retries_.empty() && early_retries_.front().second.Expired()) {
    early_retries_.pop_front();
  }
}

void MediaGather::Start(LiveRequest& r) {
  for (size_t k = 0; k < r.images.size(); ++k) StartImage(r, k);
  std::vector<v1::ImageRetry> early;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = early_retries_.begin(); it != early_retries_.end();) {
      if (it->first.request_id() == r.id) {
        early.push_back(std::move(it->first));
        it = early_retries_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const v1::ImageRetry& retry : early) ApplyRetry(r, retry);
  MaybeReady(r);
}

void MediaGather::Cancel(const LiveRequest& r, const absl::Status& why) {
  std::set<std::string> cancel;
  for (size_t k = 0; k < r.images.size(); ++k) {
    if (r.images[k].state == LiveRequest::MediaState::kReceiving) cancel.insert(r.TransferId(k));
  }
  for (const std::string& t : cancel) transfer_.Cancel(t, std::string(why.message()));
}

void MediaGather::ApplyRetry(LiveRequest& r, const v1::ImageRetry& retry) {
  std::set<size_t> moving;
  for (const v1::PromptImage& image : retry.images()) moving.insert(image.image_index());
  for (const v1::PromptImage& image : retry.images()) {
    const size_t k = image.image_index();
    if (k >= r.images.size() || r.images[k].state == LiveRequest::MediaState::kArrived) continue;
    if (r.images[k].state != LiveRequest::MediaState::kLost) {
      // The router moved an image whose source has not failed here: stop
      // that transfer; its other unfinished images not moved with it are
      // lost with it.
      const std::string old = r.TransferId(k);
      for (size_t j = 0; j < r.images.size(); ++j) {
        if (moving.count(j) && r.TransferId(j) == old) {
          r.images[j].state = LiveRequest::MediaState::kLost;
        }
      }
      LoseImages(r, old, absl::UnavailableError("moved by the router"));
    }
    r.images[k].meta = image;
    r.images[k].started = Stopwatch();
    StartImage(r, k);
  }
  bool lost = false;
  for (const auto& im : r.images) lost |= im.state == LiveRequest::MediaState::kLost;
  if (!lost) r.lost_deadline.reset();
}

void MediaGather::StartImage(LiveRequest& r, size_t k) {
  LiveRequest::Image& im = r.images[k];
  if (im.meta.expect_cached()) {  // no rows: the engine finds its KV cached
    worker::MediaEmbedding& e = im.embedding;
    e.grid = model::MediaGrid::FromThw(im.meta.grid_t(), im.meta.grid_h(), im.meta.grid_w(),
                                       options_.spatial_merge_size, model::MediaKind::kImage);
    e.key = ContentHash{im.meta.content_hash().high(), im.meta.content_hash().low()};
    e.cached = true;
    im.state = LiveRequest::MediaState::kArrived;
    r.image_tokens += static_cast<uint32_t>(e.grid.num_tokens());
    return;
  }
  im.state = LiveRequest::MediaState::kConnecting;
  auto& conn = connections_[im.meta.encoder_id()];
  if (conn == nullptr) conn = std::make_unique<Connection>();
  if (conn->address != im.meta.encoder_address()) {
    conn->address = im.meta.encoder_address();
    conn->state = Connection::State::kNone;
  }
  switch (conn->state) {
    case Connection::State::kConnected:
      StartReceive(r, k);
      return;
    case Connection::State::kConnecting:
      ++im.round_trips;  // the Connect call under way, before init
      conn->waiting.emplace_back(r.id, k);
      return;
    case Connection::State::kNone:
      ++im.round_trips;
      conn->state = Connection::State::kConnecting;
      conn->waiting.emplace_back(r.id, k);
      connector_->Post([this, encoder = im.meta.encoder_id(), address = conn->address] {
        Connect(encoder, address);
      });
      return;
  }
}

void MediaGather::Connect(const std::string& encoder, const std::string& address) {
  auto stub = v1::Encoder::NewStub(InternalChannel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoNanoseconds(options_.connect_timeout));
  v1::ConnectResponse resp;
  grpc::Status gs = stub->Connect(&ctx, transfer_.local_info(), &resp);
  absl::Status status;
  if (!gs.ok()) {
    status = absl::UnavailableError(
        absl::StrCat("connect to encoder ", encoder, " at ", address, ": ", gs.error_message()));
  } else if (resp.instance_id() != encoder) {
    status = absl::UnavailableError(
        absl::StrCat("encoder at ", address, " is ", resp.instance_id(), ", not ", encoder));
  } else {
    v1::ConnectRequest peer;
    peer.set_instance_id(resp.instance_id());
    *peer.mutable_ucx() = resp.ucx();
    *peer.mutable_embedding_buffer() = resp.embedding_buffer();
    status = transfer_.Connect(peer);
  }
  if (status.ok()) LOG(INFO) << "connected to encoder " << encoder << " at " << address;
  hooks_.post([this, encoder, address, status] { OnConnected(encoder, address, status); });
}

void MediaGather::OnConnected(const std::string& encoder, const std::string& address,
                              absl::Status status) {
  auto& conn = connections_[encoder];
  if (conn == nullptr || conn->address != address) return;  // superseded
  conn->state = status.ok() ? Connection::State::kConnected : Connection::State::kNone;
  std::vector<std::pair<std::string, size_t>> waiting = std::move(conn->waiting);
  conn->waiting.clear();
  for (const auto& [id, k] : waiting) {
    LiveRequest* found = hooks_.find(id);
    if (found == nullptr) continue;
    LiveRequest& r = *found;
    if (k >= r.images.size() || r.images[k].state != LiveRequest::MediaState::kConnecting ||
        r.images[k].meta.encoder_id() != encoder) {
      continue;
    }
    if (status.ok()) {
      StartReceive(r, k);
    } else {
      LoseImages(r, r.TransferId(k), status);
    }
  }
}

void MediaGather::StartReceive(LiveRequest& r, size_t k) {
  LiveRequest::Image& im = r.images[k];
  im.state = LiveRequest::MediaState::kReceiving;
  transfer::ReceiveRequest rr;
  rr.request_id = r.TransferId(k);
  rr.image_index = static_cast<uint32_t>(k);
  rr.sender = im.meta.encoder_id();
  rr.known_tokens = im.meta.num_tokens();
  rr.timeout = options_.transfer_timeout;
  transfer_.Receive(std::move(rr), [this, id = r.id, k, tid = r.TransferId(k)](
                                       absl::StatusOr<transfer::ReceivedMedia> image) {
    hooks_.post([this, id, k, tid, image = std::move(image)]() mutable {
      OnImage(id, k, tid, std::move(image));
    });
  });
}

void MediaGather::OnImage(const std::string& id, size_t k, const std::string& transfer_id,
                          absl::StatusOr<transfer::ReceivedMedia> image) {
  LiveRequest* found = hooks_.find(id);
  if (found == nullptr) return;
  LiveRequest& r = *found;
  if (k >= r.images.size() || r.TransferId(k) != transfer_id ||
      r.images[k].state != LiveRequest::MediaState::kReceiving) {
    return;  // a superseded source
  }
  if (!image.ok()) {
    if (image.status().code() == absl::StatusCode::kUnavailable ||
        image.status().code() == absl::StatusCode::kDeadlineExceeded) {
      // The encoder may be gone: reconnect before its next use.
      auto c = connections_.find(r.images[k].meta.encoder_id());
      if (c != connections_.end() && c->second->state == Connection::State::kConnected) {
        c->second->state = Connection::State::kNone;
      }
    }
    LoseImages(r, transfer_id, image.status());
    return;
  }
  // The grid from the M-RoPE section (t, row, column of each merged token):
  // exact whether or not the router could pre-size the image.
  const uint32_t n = image->total_tokens();
  const uint32_t chunks = image->num_chunks();
  absl::StatusOr<transfer::MediaTokenGrid> grid =
      transfer::DecodeImageGrid(image->Section(transfer::kMrope), n);
  if (!grid.ok()) {
    LoseImages(r, transfer_id,
               absl::DataLossError(absl::StrCat("image ", k, ": ", grid.status().message())));
    return;
  }
  // The rows must hold what the model adds: its main embedding and each
  // DeepStack feature (a version 1 embedding is the main one alone).
  if (absl::Status s = transfer::ExpectImageSections(
          image->Section(transfer::kAux), n, transfer_.buffer().layout().hidden_size,
          static_cast<uint32_t>(1 + options_.deepstack_levels));
      !s.ok()) {
    LoseImages(r, transfer_id, absl::DataLossError(absl::StrCat("image ", k, ": ", s.message())));
    return;
  }
  const int merge = options_.spatial_merge_size;
  worker::MediaEmbedding& e = r.images[k].embedding;
  e.cached = false;  // an image expected cached that was not arrives as any other
  // The kind was set from the prompt's slot when the request came in.
  e.grid = model::MediaGrid::FromThw(grid->t, grid->rows * merge, grid->cols * merge, merge,
                                     e.grid.kind);
  e.grid.time_step = grid->time_step;
  if (options_.mm_handoff == MmHandoff::kAsync && image->buffered_tokens() == 0 &&
      image->tail_blocks().has_value()) {
    // Seed 000: the rows stay where UCX wrote them (memory every rank maps);
    // steps name them by offset. The blocks go when the request ends.
    const transfer::ChunkRanges cr =
        transfer_.buffer().layout().ChunkInfo(*image->tail_blocks(), 0, n);
    e.shared_values =
        reinterpret_cast<const float*>(transfer_.buffer().data() + cr[transfer::kEmbedding].offset);
    r.images[k].held = std::move(*image);
  } else {
    const int64_t cpu_start = ThreadCpuNanos();
    const std::string emb = image->Section(transfer::kEmbedding);
    image->Release();
    e.values.resize(emb.size() / sizeof(float));
    std::memcpy(e.values.data(), emb.data(), e.values.size() * sizeof(float));
    metrics_.handoff_blocked_seconds->Increment((ThreadCpuNanos() - cpu_start) * 1e-9);
  }
  const auto& h = r.images[k].meta.content_hash();
  e.key = ContentHash{h.high(), h.low()};
  r.images[k].state = LiveRequest::MediaState::kArrived;
  r.image_tokens += n;
  metrics_.images_received->Increment();
  metrics_.transfer_bytes->Increment(static_cast<double>(n) *
                                     transfer_.buffer().layout().BytesPerToken());
  metrics_.transfer_seconds->Observe(r.images[k].started.ElapsedSeconds());
  if (chunks > 1) metrics_.resumes->Increment(chunks - 1);
  r.images[k].round_trips += static_cast<int>(chunks);
  MaybeReady(r);
}

int MediaGather::LoseCached(LiveRequest& r, const absl::Status& why) {
  std::vector<worker::MediaEmbedding>& given = r.engine_request.image_embeddings;
  for (size_t k = 0; k < given.size() && k < r.images.size(); ++k) {
    r.images[k].embedding = std::move(given[k]);
  }
  given.clear();
  std::set<std::string> sources;
  int lost = 0;
  for (size_t k = 0; k < r.images.size(); ++k) {
    LiveRequest::Image& im = r.images[k];
    if (!im.meta.expect_cached() || im.state != LiveRequest::MediaState::kArrived) continue;
    im.state = LiveRequest::MediaState::kReceiving;  // LoseImages takes it from here
    r.image_tokens -= static_cast<uint32_t>(im.embedding.grid.num_tokens());
    sources.insert(r.TransferId(k));
    ++lost;
  }
  for (const std::string& t : sources) LoseImages(r, t, why);
  return lost;
}

void MediaGather::LoseImages(LiveRequest& r, const std::string& transfer_id,
                             const absl::Status& why) {
  v1::TokenBatch batch;
  batch.set_request_id(r.id);
  for (size_t j = 0; j < r.images.size(); ++j) {
    LiveRequest::Image& im = r.images[j];
    if (r.TransferId(j) != transfer_id || im.state == LiveRequest::MediaState::kArrived ||
        im.state == LiveRequest::MediaState::kLost) {
      continue;
    }
    im.state = LiveRequest::MediaState::kLost;
    batch.add_lost_images(static_cast<uint32_t>(j));
  }
  // Cancelling an unknown or finished transfer is harmless.
  transfer_.Cancel(transfer_id, std::string(why.message()));
  if (batch.lost_images_size() == 0) return;
  metrics_.lost_images->Increment(batch.lost_images_size());
  batch.set_lost_reason(std::string(why.message()));
  batch.set_lost_transfer_id(transfer_id);
  LOG(WARNING) << "request " << r.id << ": lost " << batch.lost_images_size() << " image(s) from "
               << transfer_id << ": " << why;
  if (!r.lost_deadline) r.lost_deadline = Deadline::After(options_.lost_image_timeout);
  r.sink.on_batch(std::move(batch));
}

void MediaGather::MaybeReady(LiveRequest& r) {
  for (const auto& im : r.images) {
    if (im.state != LiveRequest::MediaState::kArrived) return;
  }
  r.multimodal_ms = r.images.empty() ? 0 : r.since_submit.ElapsedSeconds() * 1e3;
  int round_trips = 0;
  for (const auto& im : r.images) round_trips = std::max(round_trips, im.round_trips);
  metrics_.embedding_round_trips->Observe(round_trips);
  for (auto& im : r.images) r.engine_request.image_embeddings.push_back(std::move(im.embedding));
  hooks_.on_ready(r);
}

}  // namespace mmserve::language
