#include "transfer/kv_handoff.h"

#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "transfer/kv_segments.h"
#include "transfer/ucx_endpoint.h"
#include "transfer/ucx_request.h"
#include "transfer/ucx_status.h"

namespace mmserve::transfer {
namespace {

int64_t BlockFloats(const model::KvCacheShape& s) {
  return s.block_size * s.num_kv_heads * s.head_dim;
}

// Byte offset of `block` of `layer`'s keys (kv = 0) or values (kv = 1).
uint64_t BlockOffset(const model::KvCacheShape& s, int64_t layer, int kv, int64_t block) {
  return static_cast<uint64_t>((2 * layer + kv) * s.LayerPlaneFloats() + block * BlockFloats(s)) *
         sizeof(float);
}

absl::Status CheckBlocks(const char* side, const model::KvCacheShape& shape,
                         const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    if (b < 0 || b >= shape.num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("KV hand-off: ", side, " block ", b,
                                                     " out of range [0, ", shape.num_blocks, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* KvHandoffPathName(KvHandoffPath path) {
  switch (path) {
    case KvHandoffPath::kMapped:
      return "mapped";
    case KvHandoffPath::kRendezvous:
      return "rendezvous";
    case KvHandoffPath::kPut:
      return "put";
  }
  return "unknown";
}

uint32_t KvBlocksCrc(const model::KvCache& cache, const std::vector<int32_t>& blocks) {
  const model::KvCacheShape& s = cache.shape();
  const size_t bytes = BlockFloats(s) * sizeof(float);
  const auto* base = reinterpret_cast<const uint8_t*>(cache.Key(0));
  uint32_t crc = 0;
  for (int64_t layer = 0; layer < s.num_layers; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int32_t b : blocks) crc = Crc32cExtend(crc, base + BlockOffset(s, layer, kv, b), bytes);
    }
  }
  return crc;
}

uint32_t KvBlocksCrc(const model::KvCache& cache, const std::vector<int32_t>& blocks,
                     int64_t first_head, int64_t num_heads) {
  const model::KvCacheShape& s = cache.shape();
  const size_t token_bytes = s.num_kv_heads * s.head_dim * sizeof(float);
  const size_t slice_bytes = num_heads * s.head_dim * sizeof(float);
  const size_t skip = first_head * s.head_dim * sizeof(float);
  const auto* base = reinterpret_cast<const uint8_t*>(cache.Key(0));
  uint32_t crc = 0;
  for (int64_t layer = 0; layer < s.num_layers; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int32_t b : blocks) {
        const uint8_t* block = base + BlockOffset(s, layer, kv, b);
        for (int64_t t = 0; t < s.block_size; ++t) {
          crc = Crc32cExtend(crc, block + t * token_bytes + skip, slice_bytes);
        }
      }
    }
  }
  return crc;
}

uint64_t KvHandoffBytes(const model::KvCacheShape& target, size_t num_blocks, int64_t num_layers) {
  return static_cast<uint64_t>(2 * num_layers) * num_blocks *
         static_cast<uint64_t>(target.block_size * target.num_kv_heads * target.head_dim) *
         sizeof(float);
}

uint32_t KvGatheredCrc(const std::vector<KvHeadSource>& sources, const std::vector<int32_t>& blocks,
                       KvLayerRange layers) {
  if (sources.empty()) return 0;
  const model::KvCacheShape& s0 = sources[0].cache->shape();
  const int64_t end = layers.count == 0 ? s0.num_layers : layers.first + layers.count;
  uint32_t crc = 0;
  for (int64_t layer = layers.first; layer < end; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int32_t b : blocks) {
        for (int64_t t = 0; t < s0.block_size; ++t) {
          for (const KvHeadSource& src : sources) {
            const model::KvCacheShape& s = src.cache->shape();
            const size_t head_bytes = s.head_dim * sizeof(float);
            const auto* base = reinterpret_cast<const uint8_t*>(src.cache->Key(0));
            const uint8_t* token = base + BlockOffset(s, layer, kv, b) +
                                   t * s.num_kv_heads * head_bytes +
                                   src.heads.src_first * head_bytes;
            crc = Crc32cExtend(crc, token, src.heads.count * head_bytes);
          }
        }
      }
    }
  }
  return crc;
}

absl::Status ValidateKvHandoff(const model::KvCacheShape& src_shape,
                               const std::vector<int32_t>& src,
                               const model::KvCacheShape& dst_shape,
                               const std::vector<int32_t>& dst, int64_t first_head) {
  return ValidateKvHandoff(src_shape, src, dst_shape, dst,
                           KvHeadSlice{.src_first = first_head, .count = dst_shape.num_kv_heads});
}

absl::Status ValidateKvHandoff(const model::KvCacheShape& src_shape,
                               const std::vector<int32_t>& src,
                               const model::KvCacheShape& dst_shape,
                               const std::vector<int32_t>& dst, KvHeadSlice heads) {
  if (src_shape.num_layers != dst_shape.num_layers ||
      src_shape.block_size != dst_shape.block_size || heads.src_first < 0 || heads.dst_first < 0 ||
      heads.count < 1 || heads.src_first + heads.count > src_shape.num_kv_heads ||
      heads.dst_first + heads.count > dst_shape.num_kv_heads ||
      src_shape.head_dim != dst_shape.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV hand-off: cache geometry differs (layers ", src_shape.num_layers, "/",
        dst_shape.num_layers, ", block_size ", src_shape.block_size, "/", dst_shape.block_size,
        ", kv_heads ", src_shape.num_kv_heads, "/", dst_shape.num_kv_heads, ", ", heads.count,
        " heads from head ", heads.src_first, " to head ", heads.dst_first, ", head_dim ",
        src_shape.head_dim, "/", dst_shape.head_dim, ")"));
  }
  if (src.empty() || src.size() != dst.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV hand-off: ", src.size(), " source blocks for ", dst.size(), " target blocks"));
  }
  RETURN_IF_ERROR(CheckBlocks("source", src_shape, src));
  RETURN_IF_ERROR(CheckBlocks("target", dst_shape, dst));
  if (std::set<int32_t>(dst.begin(), dst.end()).size() != dst.size()) {
    return absl::InvalidArgumentError("KV hand-off: a target block appears twice");
  }
  return absl::OkStatus();
}

namespace {

// How long a partly landed hand-off is kept without a message from its
// sender (it died, or gave up and force-closed its endpoint).
constexpr absl::Duration kLandingIdle = absl::Seconds(60);
// Bytes per job when two threads copy into a mapped target.
constexpr uint64_t kCopyJobBytes = 1 << 20;
// How long a sender keeps an unused connection. On shm it maps the target's
// whole segment, which outlives a decode process that died (error mode
// none: nothing tells) until the last mapping goes.
constexpr absl::Duration kConnIdle = absl::Seconds(60);

}  // namespace

absl::StatusOr<std::unique_ptr<KvHandoffReceiver>> KvHandoffReceiver::Create(
    UcxContext& context, model::KvCache& cache, const UcxWorkerOptions& options) {
  std::unique_ptr<KvHandoffReceiver> rx(new KvHandoffReceiver());
  ASSIGN_OR_RETURN(rx->region_, UcxMemoryRegion::Register(context, cache.Key(0), cache.bytes()));
  RETURN_IF_ERROR(rx->Init(context, cache, options));
  return rx;
}

absl::StatusOr<std::unique_ptr<KvHandoffReceiver>> KvHandoffReceiver::CreateWithCache(
    UcxContext& context, const model::KvCacheShape& shape, const UcxWorkerOptions& options) {
  std::unique_ptr<KvHandoffReceiver> rx(new KvHandoffReceiver());
  if (context.profile() == TransportProfile::kTcp) {
    ASSIGN_OR_RETURN(rx->owned_cache_, model::KvCache::Create(shape));
    ASSIGN_OR_RETURN(rx->region_, UcxMemoryRegion::Register(context, rx->owned_cache_->Key(0),
                                                            rx->owned_cache_->bytes()));
  } else {
    ASSIGN_OR_RETURN(rx->region_, UcxMemoryRegion::Allocate(context, shape.TotalBytes()));
    ASSIGN_OR_RETURN(rx->owned_cache_, model::KvCache::CreateOn(shape, rx->region_->address(),
                                                                rx->region_->length()));
  }
  RETURN_IF_ERROR(rx->Init(context, *rx->owned_cache_, options));
  return rx;
}

absl::Status KvHandoffReceiver::Init(UcxContext& context, model::KvCache& cache,
                                     const UcxWorkerOptions& options) {
  ASSIGN_OR_RETURN(worker_, UcxWorker::Create(context, options));
  auto* base = reinterpret_cast<uint8_t*>(cache.Key(0));
  pad_ = std::make_unique<KvLandingPad>(*worker_, base, cache.bytes());
  KvLandingPad* pad = pad_.get();
  // Puts UCX emulates need this side's progress, and so do the rendezvous
  // of landing messages: never sleep while a hand-off is partly landed.
  worker_->Start([pad] { pad->Expire(kLandingIdle); }, [pad] { return pad->active(); });
  RETURN_IF_ERROR(worker_->RunSync([pad] { return pad->Register(); }));
  ASSIGN_OR_RETURN(target_.rkey, region_->PackRkey());
  target_.worker_address = worker_->address();
  target_.base_address = reinterpret_cast<uint64_t>(base);
  target_.shape = cache.shape();
  return absl::OkStatus();
}

KvHandoffReceiver::~KvHandoffReceiver() {
  if (worker_ == nullptr) return;
  if (pad_ != nullptr) {
    (void)worker_->RunSync([this] {
      pad_->Close();
      return absl::OkStatus();
    });
  }
  worker_->Stop();
}

absl::Status KvHandoffReceiver::AwaitLandedWrites() {
  return worker_->RunSync([] { return absl::OkStatus(); });
}

struct KvHandoffSender::Conn {
  std::unique_ptr<UcxEndpoint> ep;
  std::string packed_rkey;
  std::unique_ptr<UcxRemoteKey> rkey;
  // The target cache's first byte where its shared segment is mapped here
  // (shm), else null.
  uint8_t* mapped = nullptr;
  bool failed = false;  // UCX reported the peer lost
  absl::Time last_used;
  // On the progress thread (the last reference is dropped there).
  ~Conn() {
    rkey.reset();
    if (ep != nullptr) ep->Close(Deadline::After(absl::ZeroDuration()));
  }
};

absl::StatusOr<std::unique_ptr<KvHandoffSender>> KvHandoffSender::Create(
    UcxContext& context, model::KvCache& cache, const UcxWorkerOptions& options) {
  std::random_device random;
  const uint64_t id = (uint64_t{random()} << 32) ^ random();
  std::unique_ptr<KvHandoffSender> tx(
      new KvHandoffSender(cache, id, context.profile() == TransportProfile::kTcp));
  ASSIGN_OR_RETURN(tx->region_, UcxMemoryRegion::Register(context, cache.Key(0), cache.bytes()));
  ASSIGN_OR_RETURN(tx->worker_, UcxWorker::Create(context, options));
  KvHandoffSender* self = tx.get();
  tx->worker_->Start([self] { self->ExpireConns(kConnIdle); },
                     [self] { return self->in_flight_.load() > 0; });
  RETURN_IF_ERROR(tx->worker_->RunSync([self] { return self->RegisterLanded(); }));
  tx->copier_ = std::make_unique<ChecksumWorker>();
  return tx;
}

void KvHandoffSender::DropConn(const std::string& address) { conns_.erase(address); }

void KvHandoffSender::ExpireConns(absl::Duration idle) {
  const absl::Time now = absl::Now();
  if (now < next_sweep_) return;
  next_sweep_ = now + absl::Seconds(1);
  // A Send under way holds its own reference: it finishes with it.
  for (auto it = conns_.begin(); it != conns_.end();) {
    it = now - it->second->last_used > idle ? conns_.erase(it) : std::next(it);
  }
}

KvHandoffSender::~KvHandoffSender() {
  if (worker_ == nullptr) return;
  (void)worker_->RunSync([this] {
    conns_.clear();
    pending_.clear();
    return absl::OkStatus();
  });
  worker_->Stop();
}

absl::StatusOr<std::shared_ptr<KvHandoffSender::Conn>> KvHandoffSender::Connection(
    const KvHandoffTarget& target) {
  const std::string& address = target.worker_address;
  auto it = conns_.find(address);
  if (it != conns_.end() && (it->second->failed || it->second->packed_rkey != target.rkey)) {
    DropConn(address);  // lost, or the decode side re-registered its cache
    it = conns_.end();
  }
  if (it != conns_.end()) {
    it->second->last_used = absl::Now();
    return it->second;
  }
  auto conn = std::make_shared<Conn>();
  conn->last_used = absl::Now();
  std::weak_ptr<Conn> weak = conn;
  ASSIGN_OR_RETURN(conn->ep, UcxEndpoint::Create(*worker_, address, [weak](absl::Status) {
                     if (auto c = weak.lock()) c->failed = true;
                   }));
  ASSIGN_OR_RETURN(conn->rkey, UcxRemoteKey::Unpack(conn->ep->get(), target.rkey));
  void* mapped = nullptr;
  if (ucp_rkey_ptr(conn->rkey->get(), target.base_address, &mapped) == UCS_OK) {
    conn->mapped = static_cast<uint8_t*>(mapped);
  }
  conn->packed_rkey = target.rkey;
  conns_.emplace(address, conn);
  return conn;
}

absl::StatusOr<uint32_t> KvHandoffSender::Send(const KvHandoffTarget& target,
                                               const std::vector<int32_t>& src,
                                               const std::vector<int32_t>& dst, Deadline deadline,
                                               int64_t first_head, KvHandoffPath* path) {
  return SendLayers(target, src, dst, deadline, KvLayerRange{}, first_head, path);
}

absl::StatusOr<uint32_t> KvHandoffSender::SendLayers(const KvHandoffTarget& target,
                                                     const std::vector<int32_t>& src,
                                                     const std::vector<int32_t>& dst,
                                                     Deadline deadline, KvLayerRange layers,
                                                     int64_t first_head, KvHandoffPath* path) {
  return SendLayers(target, src, dst, deadline, layers,
                    KvHeadSlice{.src_first = first_head, .count = target.shape.num_kv_heads}, path);
}

absl::StatusOr<uint32_t> KvHandoffSender::SendLayers(const KvHandoffTarget& target,
                                                     const std::vector<int32_t>& src,
                                                     const std::vector<int32_t>& dst,
                                                     Deadline deadline, KvLayerRange layers,
                                                     KvHeadSlice heads, KvHandoffPath* path) {
  ASSIGN_OR_RETURN(std::unique_ptr<KvHandoffWrite> write,
                   Start(target, src, dst, deadline, layers, heads));
  if (path != nullptr) *path = write->path();
  return write->Finish();
}

absl::StatusOr<std::unique_ptr<KvHandoffWrite>> KvHandoffSender::Start(
    const KvHandoffTarget& target, const std::vector<int32_t>& src, const std::vector<int32_t>& dst,
    Deadline deadline, KvLayerRange layers, KvHeadSlice heads) {
  const model::KvCacheShape& s = cache_.shape();
  RETURN_IF_ERROR(ValidateKvHandoff(s, src, target.shape, dst, heads));
  const int64_t count = layers.count == 0 ? s.num_layers - layers.first : layers.count;
  if (layers.first < 0 || count < 1 || layers.first + count > s.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("KV hand-off: layers ", layers.first, " + ",
                                                   layers.count, " of ", s.num_layers));
  }
  std::unique_ptr<KvHandoffWrite> write(new KvHandoffWrite(*this));
  write->address_ = target.worker_address;
  write->segments_ = PlanKvSegments(s, target.shape, src, dst, heads, layers.first, count);
  write->deadline_ = deadline;
  const auto* base = reinterpret_cast<const uint8_t*>(cache_.Key(0));
  std::shared_ptr<Conn> conn;
  ++in_flight_;  // until Finish (or a failed Start)
  absl::Status connected = worker_->RunSync([&]() -> absl::Status {
    ASSIGN_OR_RETURN(conn, Connection(target));
    return absl::OkStatus();
  });
  if (!connected.ok()) {
    (void)worker_->RunSync([&] {
      DropConn(target.worker_address);  // nothing was sent
      return absl::OkStatus();
    });
    --in_flight_;
    write->finished_ = true;
    return absl::UnavailableError(absl::StrCat("KV hand-off failed: ", connected.message()));
  }
  if (conn->mapped != nullptr) {
    // The target's segment is mapped here: copy into it on two cores,
    // checksumming as we copy; complete when the copy is (no UCX operation).
    write->path_ = KvHandoffPath::kMapped;
    write->copy_ = KvSegmentCopy::Start(ChunkKvSegments(write->segments_, kCopyJobBytes), base,
                                        conn->mapped, *copier_);
    write->conn_ = std::move(conn);
    return write;
  }
  auto state = std::make_shared<KvSendState>();
  const bool sliced = target.shape.num_kv_heads != cache_.shape().num_kv_heads;
  write->path_ = sliced ? KvHandoffPath::kPut : KvHandoffPath::kRendezvous;
  write->state_ = state;
  absl::Status started = worker_->RunSync([&]() -> absl::Status {
    write->seq_ = ++next_seq_;
    const KvSendPlan plan = {.segments = write->segments_,
                             .base = base,
                             .target_base = target.base_address,
                             .ep = conn->ep->get(),
                             .rkey = conn->rkey->get(),
                             .sender = id_,
                             .seq = write->seq_,
                             .in_flight = KvMessagesInFlight(tcp_)};
    if (sliced) {
      StartKvPuts(plan, state);
    } else {
      pending_[write->seq_] = state;
      StartKvMessages(plan, state);
    }
    conn.reset();  // a Conn is destroyed on the progress thread
    return absl::OkStatus();
  });
  if (!started.ok()) {  // the worker is stopping: nothing was posted
    --in_flight_;
    write->finished_ = true;
    return absl::UnavailableError(absl::StrCat("KV hand-off failed: ", started.message()));
  }
  return write;
}

absl::StatusOr<uint32_t> KvHandoffSender::FinishWrite(KvHandoffWrite& w) {
  const auto* base = reinterpret_cast<const uint8_t*>(cache_.Key(0));
  if (w.copy_ != nullptr) {
    const uint32_t crc = w.copy_->Finish();
    (void)worker_->RunSync([&] {
      w.conn_.reset();  // a Conn is destroyed on the progress thread
      return absl::OkStatus();
    });
    --in_flight_;
    return crc;
  }
  // The checksum of the source bytes (which the sends only read) while they
  // fly on the progress thread.
  uint32_t crc = 0;
  for (const KvSegment& seg : w.segments_) crc = Crc32cExtend(crc, base + seg.src, seg.bytes);
  KvSendState& state = *w.state_;
  const bool in_time = state.done.WaitForNotificationWithTimeout(w.deadline_.Remaining());
  if (!in_time || !state.result.ok()) {
    // Force-close: pending operations fail on tcp; on shm (error mode none)
    // their callbacks may never run, hence the bound (the callbacks own
    // the state, so returning first is safe).
    (void)worker_->RunSync([&] {
      pending_.erase(w.seq_);
      DropConn(w.address_);
      return absl::OkStatus();
    });
    (void)state.done.WaitForNotificationWithTimeout(absl::Milliseconds(500));
  }
  --in_flight_;
  if (!in_time) {
    return absl::DeadlineExceededError(
        absl::StrCat("KV hand-off of ", w.segments_.size(), " segments did not complete in time"));
  }
  if (!state.result.ok()) {
    return absl::UnavailableError(absl::StrCat("KV hand-off failed: ", state.result.message()));
  }
  return crc;
}

bool KvHandoffWrite::settled() const {
  return copy_ != nullptr ? copy_->helped() : state_->done.HasBeenNotified();
}

KvHandoffWrite::~KvHandoffWrite() {
  if (!finished_) (void)Finish();
}

absl::StatusOr<uint32_t> KvHandoffWrite::Finish() {
  if (finished_) return absl::FailedPreconditionError("KV hand-off: the write was finished");
  finished_ = true;
  return sender_.FinishWrite(*this);
}

absl::Status KvHandoffSender::RegisterLanded() {
  return SetUcxAmHandler(worker_->get(), kKvAmLanded, &KvHandoffSender::OnLanded, this);
}

ucs_status_t KvHandoffSender::OnLanded(void* arg, const void* header, size_t header_length,
                                       void* data, size_t length,
                                       const ucp_am_recv_param_t* param) {
  auto* self = static_cast<KvHandoffSender*>(arg);
  KvLandedHeader h;
  if (header_length != sizeof(h)) return UCS_OK;
  std::memcpy(&h, header, sizeof(h));
  auto it = self->pending_.find(h.seq);
  if (it == self->pending_.end()) return UCS_OK;  // gave up on it already
  std::shared_ptr<KvSendState> state = std::move(it->second);
  self->pending_.erase(it);
  state->Complete(h.ok == 1 ? absl::OkStatus()
                            : absl::DataLossError("the decode side refused part of the hand-off"));
  return UCS_OK;
}

}  // namespace mmserve::transfer
