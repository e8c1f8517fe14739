#include "transfer/kv_handoff.h"

#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "transfer/ucx_endpoint.h"
#include "transfer/ucx_request.h"

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

absl::Status ValidateKvHandoff(const model::KvCacheShape& src_shape,
                               const std::vector<int32_t>& src,
                               const model::KvCacheShape& dst_shape,
                               const std::vector<int32_t>& dst, int64_t first_head) {
  if (src_shape.num_layers != dst_shape.num_layers ||
      src_shape.block_size != dst_shape.block_size || first_head < 0 ||
      first_head + dst_shape.num_kv_heads > src_shape.num_kv_heads ||
      src_shape.head_dim != dst_shape.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV hand-off: cache geometry differs (layers ", src_shape.num_layers, "/",
        dst_shape.num_layers, ", block_size ", src_shape.block_size, "/", dst_shape.block_size,
        ", kv_heads ", src_shape.num_kv_heads, "/", dst_shape.num_kv_heads, " from head ",
        first_head, ", head_dim ", src_shape.head_dim, "/", dst_shape.head_dim, ")"));
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

absl::StatusOr<std::unique_ptr<KvHandoffReceiver>> KvHandoffReceiver::Create(
    UcxContext& context, model::KvCache& cache, const UcxWorkerOptions& options) {
  std::unique_ptr<KvHandoffReceiver> rx(new KvHandoffReceiver());
  ASSIGN_OR_RETURN(rx->region_, UcxMemoryRegion::Register(context, cache.Key(0), cache.bytes()));
  ASSIGN_OR_RETURN(rx->worker_, UcxWorker::Create(context, options));
  // Puts UCX emulates need this side's progress: never sleep for long.
  rx->worker_->Start(nullptr);
  ASSIGN_OR_RETURN(rx->target_.rkey, rx->region_->PackRkey());
  rx->target_.worker_address = rx->worker_->address();
  rx->target_.base_address = reinterpret_cast<uint64_t>(cache.Key(0));
  rx->target_.shape = cache.shape();
  return rx;
}

absl::StatusOr<std::unique_ptr<KvHandoffReceiver>> KvHandoffReceiver::CreateWithCache(
    UcxContext& context, const model::KvCacheShape& shape, const UcxWorkerOptions& options) {
  std::unique_ptr<KvHandoffReceiver> rx(new KvHandoffReceiver());
  ASSIGN_OR_RETURN(rx->region_, UcxMemoryRegion::Allocate(context, shape.TotalBytes()));
  ASSIGN_OR_RETURN(rx->owned_cache_,
                   model::KvCache::CreateOn(shape, rx->region_->address(), rx->region_->length()));
  ASSIGN_OR_RETURN(rx->worker_, UcxWorker::Create(context, options));
  rx->worker_->Start(nullptr);
  ASSIGN_OR_RETURN(rx->target_.rkey, rx->region_->PackRkey());
  rx->target_.worker_address = rx->worker_->address();
  rx->target_.base_address = reinterpret_cast<uint64_t>(rx->owned_cache_->Key(0));
  rx->target_.shape = shape;
  return rx;
}

KvHandoffReceiver::~KvHandoffReceiver() {
  if (worker_ != nullptr) worker_->Stop();
}

absl::Status KvHandoffReceiver::AwaitLandedWrites() {
  return worker_->RunSync([] { return absl::OkStatus(); });
}

absl::StatusOr<std::unique_ptr<KvHandoffSender>> KvHandoffSender::Create(
    UcxContext& context, model::KvCache& cache, const UcxWorkerOptions& options) {
  std::unique_ptr<KvHandoffSender> tx(new KvHandoffSender(cache));
  ASSIGN_OR_RETURN(tx->region_, UcxMemoryRegion::Register(context, cache.Key(0), cache.bytes()));
  ASSIGN_OR_RETURN(tx->worker_, UcxWorker::Create(context, options));
  tx->worker_->Start(nullptr);
  return tx;
}

struct KvHandoffSender::Conn {
  std::unique_ptr<UcxEndpoint> ep;
  std::string packed_rkey;
  std::unique_ptr<UcxRemoteKey> rkey;
  bool failed = false;  // UCX reported the peer lost
};

void KvHandoffSender::DropConn(const std::string& address) {
  auto it = conns_.find(address);
  if (it == conns_.end()) return;
  if (it->second != nullptr) {
    it->second->rkey.reset();
    if (it->second->ep != nullptr) it->second->ep->Close(Deadline::After(absl::ZeroDuration()));
  }
  conns_.erase(it);
}

KvHandoffSender::~KvHandoffSender() {
  if (worker_ == nullptr) return;
  (void)worker_->RunSync([this] {
    while (!conns_.empty()) DropConn(conns_.begin()->first);
    return absl::OkStatus();
  });
  worker_->Stop();
}

namespace {

// One Send's state, shared with the progress thread's callbacks.
struct SendState {
  absl::Status first_error;  // progress thread only until `done`
  absl::Status result;       // set once, before `done` is notified
  absl::Notification done;
};

// What one Send puts where.
struct PutPlan {
  const model::KvCacheShape& source;
  const uint8_t* base;  // the source cache's first byte
  const KvHandoffTarget& target;
  const std::vector<int32_t>& src;
  const std::vector<int32_t>& dst;
  int64_t first_head;
  ucp_ep_h ep;
  ucp_rkey_h rkey;
};

// Progress thread: the puts of the blocks of one layer's keys (kv = 0) or
// values (kv = 1); each put reports its outcome to `note`.
void StartPlanePuts(const PutPlan& plan, int64_t layer, int kv, const UcxDone& note) {
  const model::KvCacheShape& s = plan.source;
  // A head slice (a tensor-parallel rank): one put per token.
  const bool sliced = plan.target.shape.num_kv_heads != s.num_kv_heads;
  const size_t token_bytes = s.num_kv_heads * s.head_dim * sizeof(float);
  const size_t slice_bytes = plan.target.shape.num_kv_heads * s.head_dim * sizeof(float);
  const size_t skip = plan.first_head * s.head_dim * sizeof(float);
  const size_t bytes = BlockFloats(s) * sizeof(float);
  const std::vector<int32_t>& src = plan.src;
  const std::vector<int32_t>& dst = plan.dst;
  for (size_t i = 0; i < src.size(); ++i) {
    const uint8_t* from = plan.base + BlockOffset(s, layer, kv, src[i]);
    const uint64_t to =
        plan.target.base_address + BlockOffset(plan.target.shape, layer, kv, dst[i]);
    if (!sliced) {
      // A run of blocks consecutive on both sides is one put (blocks of one
      // layer's plane are adjacent in memory).
      size_t run = 1;
      while (i + run < src.size() && src[i + run] == src[i] + static_cast<int32_t>(run) &&
             dst[i + run] == dst[i] + static_cast<int32_t>(run)) {
        ++run;
      }
      const size_t run_bytes = run * bytes;
      StartUcxOp(
          [&](const ucp_request_param_t& p) {
            return ucp_put_nbx(plan.ep, from, run_bytes, to, plan.rkey, &p);
          },
          note);
      i += run - 1;
      continue;
    }
    for (int64_t t = 0; t < s.block_size; ++t) {
      const uint8_t* f = from + t * token_bytes + skip;
      const uint64_t d = to + t * slice_bytes;
      StartUcxOp(
          [&](const ucp_request_param_t& p) {
            return ucp_put_nbx(plan.ep, f, slice_bytes, d, plan.rkey, &p);
          },
          note);
    }
  }
}

// Progress thread: every put of `plan`, then a flush whose completion (once
// every put is remotely complete) settles `state`.
void StartPuts(const PutPlan& plan, const std::shared_ptr<SendState>& state) {
  const UcxDone note = [state](absl::Status st) {
    if (!st.ok() && state->first_error.ok()) state->first_error = st;
  };
  // Layer by layer, so a later version can start a layer as soon as prefill
  // has computed it.
  for (int64_t layer = 0; layer < plan.source.num_layers; ++layer) {
    for (int kv = 0; kv < 2; ++kv) StartPlanePuts(plan, layer, kv, note);
  }
  StartUcxOp([&](const ucp_request_param_t& p) { return ucp_ep_flush_nbx(plan.ep, &p); },
             [state](absl::Status st) {
               state->result = !state->first_error.ok() ? state->first_error : st;
               state->done.Notify();
             });
}

}  // namespace

absl::StatusOr<std::shared_ptr<KvHandoffSender::Conn>> KvHandoffSender::Connection(
    const KvHandoffTarget& target) {
  const std::string& address = target.worker_address;
  auto it = conns_.find(address);
  if (it != conns_.end() && (it->second->failed || it->second->packed_rkey != target.rkey)) {
    DropConn(address);  // lost, or the decode side re-registered its cache
    it = conns_.end();
  }
  if (it != conns_.end()) return it->second;
  auto conn = std::make_shared<Conn>();
  std::weak_ptr<Conn> weak = conn;
  ASSIGN_OR_RETURN(conn->ep, UcxEndpoint::Create(*worker_, address, [weak](absl::Status) {
                     if (auto c = weak.lock()) c->failed = true;
                   }));
  ASSIGN_OR_RETURN(conn->rkey, UcxRemoteKey::Unpack(conn->ep->get(), target.rkey));
  conn->packed_rkey = target.rkey;
  conns_.emplace(address, conn);
  return conn;
}

absl::StatusOr<uint32_t> KvHandoffSender::Send(const KvHandoffTarget& target,
                                               const std::vector<int32_t>& src,
                                               const std::vector<int32_t>& dst, Deadline deadline,
                                               int64_t first_head) {
  const model::KvCacheShape& s = cache_.shape();
  RETURN_IF_ERROR(ValidateKvHandoff(s, src, target.shape, dst, first_head));
  auto state = std::make_shared<SendState>();
  const std::string& address = target.worker_address;
  absl::Status started = worker_->RunSync([&]() -> absl::Status {
    ASSIGN_OR_RETURN(std::shared_ptr<Conn> conn, Connection(target));
    StartPuts({.source = s,
               .base = reinterpret_cast<const uint8_t*>(cache_.Key(0)),
               .target = target,
               .src = src,
               .dst = dst,
               .first_head = first_head,
               .ep = conn->ep->get(),
               .rkey = conn->rkey->get()},
              state);
    return absl::OkStatus();
  });
  if (!started.ok()) {
    (void)worker_->RunSync([&] {
      DropConn(address);  // nothing was put
      return absl::OkStatus();
    });
    return absl::UnavailableError(absl::StrCat("KV hand-off: ", started.message()));
  }
  // The checksum of the source blocks (which the puts only read) while the
  // puts are in flight on the progress thread.
  const bool sliced = target.shape.num_kv_heads != s.num_kv_heads;
  const uint32_t crc = sliced ? KvBlocksCrc(cache_, src, first_head, target.shape.num_kv_heads)
                              : KvBlocksCrc(cache_, src);
  const bool in_time = state->done.WaitForNotificationWithTimeout(deadline.Remaining());
  if (!in_time || !state->result.ok()) {
    // Force-close: a pending flush fails on tcp; on shm (error mode none)
    // its callback may never run, hence the bound (the callbacks own
    // `state`, so returning first is safe).
    (void)worker_->RunSync([&] {
      DropConn(address);
      return absl::OkStatus();
    });
    (void)state->done.WaitForNotificationWithTimeout(absl::Milliseconds(500));
  }
  if (!in_time) {
    return absl::DeadlineExceededError(
        absl::StrCat("KV hand-off of ", src.size(), " blocks did not complete in time"));
  }
  if (!state->result.ok()) {
    return absl::UnavailableError(absl::StrCat("KV hand-off failed: ", state->result.message()));
  }
  return crc;
}

}  // namespace mmserve::transfer
