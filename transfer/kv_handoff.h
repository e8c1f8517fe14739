// KV hand-off of one request's blocks, prefill -> decode (the
// language service's P/D roles use it).
//
// The decode side registers its whole KvCache with UCX and publishes a
// KvHandoffTarget (worker address, rkey, base address, cache shape); it
// allocates blocks for the request (AllocateKv). The prefill side writes the
// request's blocks there, layer by layer (keys then values), and only once
// every byte is remotely complete returns the CRC32C of what it sent - the
// value that travels in KvCommit, after the data (data
// complete before the notice). The decode side recomputes KvBlocksCrc over
// its copies before it adopts them.
//
// How the bytes move, by what is fastest where:
//   - target cache mapped here (shm profile, cache in a UCX-allocated shared
//     segment, CreateWithCache: what the language service's decode ranks
//     use): the sender copies into it itself on two cores, computing the CRC
//     in the same pass (no UCX operation, no flush);
//   - otherwise (tcp; shm into private memory): each run of blocks
//     consecutive on both sides is one active message that lands by
//     rendezvous straight into the target blocks (a few at a time, see
//     KvMessagesInFlight), and the receiver answers once all have landed
//     (kv_landing.h); the CRC is computed while they fly;
//   - a head slice (tensor-parallel decode rank) that is not mapped: one put
//     per token, then a flush.
//
//   // decode (the cache in the receiver: mapped by senders on shm)
//   ASSIGN_OR_RETURN(auto rx, KvHandoffReceiver::CreateWithCache(*ctx, shape, {.name = "d-0"}));
//   model::KvCache& decode_cache = *rx->owned_cache();
//   KvHandoffTarget target = rx->target();  // to the prefill side (Connect)
//   // prefill
//   ASSIGN_OR_RETURN(auto tx, KvHandoffSender::Create(*ctx, prefill_cache, {.name = "prefill-0"}));
//   KvHandoffPath path;  // optional: how the bytes moved
//   ASSIGN_OR_RETURN(uint32_t crc, tx->Send(target, {3, 4}, {17, 9}, deadline, 0, &path));
//   // several writes at once (the pairs of a tensor-parallel hand-off):
//   // started one after another, every one moving before any is waited for
//   ASSIGN_OR_RETURN(auto w0, tx0->Start(target0, src, dst0, deadline, {}, heads0));
//   ASSIGN_OR_RETURN(auto w1, tx1->Start(target1, src, dst1, deadline, {}, heads1));
//   absl::StatusOr<uint32_t> crc0 = w0->Finish(), crc1 = w1->Finish();
//   // decode, on KvCommit
//   RETURN_IF_ERROR(rx->AwaitLandedWrites());
//   if (KvBlocksCrc(decode_cache, {17, 9}) != crc) ... DataLoss
//
// Both caches must agree on layers, block size, KV heads and head dim (the
// number of blocks may differ). The receiver's cache must outlive it, and no
// one may write the target blocks while a hand-off into them is in flight.
// Thread-safety: Send, Start and target() are thread-safe; each object runs
// its own UCX worker and progress thread (the sender also a copy thread).
#ifndef MMSERVE_TRANSFER_KV_HANDOFF_H_
#define MMSERVE_TRANSFER_KV_HANDOFF_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "model/kv_cache.h"
#include "transfer/checksum_worker.h"
#include "transfer/kv_landing.h"
#include "transfer/kv_segments.h"
#include "transfer/kv_send.h"
#include "transfer/ucx_context.h"
#include "transfer/ucx_memory.h"
#include "transfer/ucx_worker.h"

namespace mmserve::transfer {

// What the prefill side needs to write into a decode instance's cache.
// How one Send moved its bytes (the three paths above), for metrics.
enum class KvHandoffPath {
  kMapped,      // copied into the target's segment, mapped here
  kRendezvous,  // active messages landed by rendezvous, then the landed reply
  kPut,         // a head slice: one put per token, then a flush
};
// "mapped", "rendezvous", "put".
const char* KvHandoffPathName(KvHandoffPath path);

// A layer group of a layer-wise hand-off: layers [first, first + count)
// (count 0: to the last layer). The default is every layer.
struct KvLayerRange {
  int64_t first = 0;
  int64_t count = 0;
};

// Bytes a hand-off of `num_blocks` blocks moves for `num_layers` layers into
// a target shaped `target` (its KV heads): the length that Crc32cCombine
// needs to join the CRC32Cs of consecutive layer groups into the whole's.
uint64_t KvHandoffBytes(const model::KvCacheShape& target, size_t num_blocks, int64_t num_layers);

struct KvHandoffTarget {
  std::string worker_address;
  std::string rkey;
  uint64_t base_address = 0;  // the decode cache's first byte
  model::KvCacheShape shape;
};

// CRC32C of `blocks` of `cache` in hand-off order: for each layer, its keys
// then its values, each block in list order. Blocks must be in range.
uint32_t KvBlocksCrc(const model::KvCache& cache, const std::vector<int32_t>& blocks);
// The same over KV heads [first_head, first_head + num_heads) of each token
// only: what a decode rank holding those heads receives (tensor parallelism),
// so it equals that rank's KvBlocksCrc over its own blocks.
uint32_t KvBlocksCrc(const model::KvCache& cache, const std::vector<int32_t>& blocks,
                     int64_t first_head, int64_t num_heads);

// InvalidArgument unless `src` blocks of a cache shaped `src_shape` can be
// written into `dst` blocks of one shaped `dst_shape` (same layers, block
// size and head dim; dst's KV heads the slice of src's that starts at
// `first_head`; lists of equal non-zero length, every block in range, no
// target block twice).
absl::Status ValidateKvHandoff(const model::KvCacheShape& src_shape,
                               const std::vector<int32_t>& src,
                               const model::KvCacheShape& dst_shape,
                               const std::vector<int32_t>& dst, int64_t first_head = 0);
// The same for `heads` of each token (source heads [src_first, src_first +
// count) into target heads [dst_first, dst_first + count)).
absl::Status ValidateKvHandoff(const model::KvCacheShape& src_shape,
                               const std::vector<int32_t>& src,
                               const model::KvCacheShape& dst_shape,
                               const std::vector<int32_t>& dst, KvHeadSlice heads);

// One source cache's part of a target's heads: its heads
// [heads.src_first, + count) become the target's [heads.dst_first, + count).
struct KvHeadSource {
  const model::KvCache* cache = nullptr;
  KvHeadSlice heads;
};
// The KvBlocksCrc a target of `target_heads` KV heads computes over its
// blocks once every source wrote its part of `blocks` (the same block ids in
// every source), over `layers` only: the sources' slices taken in the
// target's order (for each layer, keys then values, block, token, source).
// `sources` must be in target head order and cover its heads.
uint32_t KvGatheredCrc(const std::vector<KvHeadSource>& sources, const std::vector<int32_t>& blocks,
                       KvLayerRange layers);

// Decode side: exposes a KvCache to remote writes and lands the hand-off
// messages of senders that cannot map it. The progress thread keeps running
// while a hand-off is partly landed.
class KvHandoffReceiver {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KvHandoffReceiver>> Create(
      UcxContext& context, model::KvCache& cache, const UcxWorkerOptions& options);
  // Also creates the cache (zeroed), owned by the receiver: on the shm
  // profile in a shared-memory segment UCX allocates, which senders on this
  // host map and copy into themselves (KvHandoffPath::kMapped); on tcp in
  // private memory registered as by Create (nothing could map it).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KvHandoffReceiver>> CreateWithCache(
      UcxContext& context, const model::KvCacheShape& shape, const UcxWorkerOptions& options);
  // The cache CreateWithCache made (null after Create); it lives as long as
  // the receiver.
  model::KvCache* owned_cache() { return owned_cache_.get(); }
  ~KvHandoffReceiver();
  KvHandoffReceiver(const KvHandoffReceiver&) = delete;
  KvHandoffReceiver& operator=(const KvHandoffReceiver&) = delete;

  const KvHandoffTarget& target() const { return target_; }

  // Makes the writes of every hand-off whose Send has returned visible to
  // the calling thread. Landing messages and puts that UCX emulates are
  // written on this receiver's progress thread, and a commit notice that reaches another thread (a
  // gRPC handler, a pipe) carries no happens-before edge from them; one round trip through the
  // progress thread's queue does (the sender's flush or landed message completed only after those
  // writes ran there). Call it after a commit arrives and before reading or adopting its blocks,
  // and before handing blocks that were read out for a new hand-off (the same edge the other way:
  // earlier reads before the coming writes). Thread-safe.
  [[nodiscard]] absl::Status AwaitLandedWrites();

 private:
  KvHandoffReceiver() = default;
  absl::Status Init(UcxContext& context, model::KvCache& cache, const UcxWorkerOptions& options);
  // Declared before region_: goes after the region that registers it (on
  // shm it lies in the region, which frees the memory).
  std::unique_ptr<model::KvCache> owned_cache_;
  std::unique_ptr<UcxMemoryRegion> region_;
  // Declared before worker_: UCX callbacks reach it until the worker is gone.
  std::unique_ptr<KvLandingPad> pad_;
  std::unique_ptr<UcxWorker> worker_;
  KvHandoffTarget target_;
};

class KvHandoffWrite;

// Prefill side: writes blocks of its KvCache into a receiver's.
class KvHandoffSender {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KvHandoffSender>> Create(
      UcxContext& context, model::KvCache& cache, const UcxWorkerOptions& options);
  ~KvHandoffSender();
  KvHandoffSender(const KvHandoffSender&) = delete;
  KvHandoffSender& operator=(const KvHandoffSender&) = delete;

  // Writes local blocks `src[i]` into the target's `dst[i]` and returns, once
  // the writes are remotely complete, KvBlocksCrc of the source blocks.
  // (Into a mapped target the copy is done when Send returns; the deadline
  // bounds only the other paths.)
  // InvalidArgument for a bad pairing (ValidateKvHandoff), DeadlineExceeded
  // when the target does not complete the writes in time (then the endpoint
  // is force-closed: the target blocks hold unspecified bytes and must not be
  // adopted), Unavailable when UCX reports the peer lost. The local blocks
  // must not change until Send returns.
  //
  // A target with fewer KV heads than this cache is one rank of a
  // tensor-parallel decode group: it receives heads [first_head,
  // first_head + its heads) of every token (one put per token and block
  // instead of one per block, unless mapped), and the CRC is KvBlocksCrc of
  // that slice. With `path`, sets *path to how the bytes moved once they
  // start to (left alone when Send fails before).
  [[nodiscard]] absl::StatusOr<uint32_t> Send(const KvHandoffTarget& target,
                                              const std::vector<int32_t>& src,
                                              const std::vector<int32_t>& dst, Deadline deadline,
                                              int64_t first_head = 0,
                                              KvHandoffPath* path = nullptr);
  // The same for one layer group only: what a layer-wise hand-off sends as
  // soon as those layers are computed, overlapped with the next ones. The
  // CRC is KvBlocksCrc's over those layers; the groups' CRCs in layer order,
  // joined by Crc32cCombine (with KvHandoffBytes), equal the whole's, and
  // the target blocks end up as after one Send. InvalidArgument for a range
  // outside the cache's layers.
  [[nodiscard]] absl::StatusOr<uint32_t> SendLayers(const KvHandoffTarget& target,
                                                    const std::vector<int32_t>& src,
                                                    const std::vector<int32_t>& dst,
                                                    Deadline deadline, KvLayerRange layers,
                                                    int64_t first_head = 0,
                                                    KvHandoffPath* path = nullptr);
  // The same for a head slice either way: a tensor-parallel prefill rank
  // writes its heads into a target that holds more (or others) at
  // heads.dst_first. The CRC is over the source bytes moved, in order.
  [[nodiscard]] absl::StatusOr<uint32_t> SendLayers(const KvHandoffTarget& target,
                                                    const std::vector<int32_t>& src,
                                                    const std::vector<int32_t>& dst,
                                                    Deadline deadline, KvLayerRange layers,
                                                    KvHeadSlice heads,
                                                    KvHandoffPath* path = nullptr);
  // SendLayers in two steps: Start validates, connects and sets the bytes
  // moving (the operations posted on the progress thread, or a mapped
  // target's copy begun on the copy thread) and returns without waiting;
  // the write's Finish waits and returns what SendLayers would. Writes of
  // several senders, or of one to several targets, overlap this way. A
  // failed Start sent nothing; the source blocks are read until Finish.
  [[nodiscard]] absl::StatusOr<std::unique_ptr<KvHandoffWrite>> Start(
      const KvHandoffTarget& target, const std::vector<int32_t>& src,
      const std::vector<int32_t>& dst, Deadline deadline, KvLayerRange layers, KvHeadSlice heads);
  // Writes started and not yet finished. Thread-safe.
  int writes_in_flight() const { return in_flight_.load(); }

 private:
  friend class KvHandoffWrite;
  // An endpoint, the target's unpacked rkey and where it maps the target
  // here, kept across hand-offs to the same decode side (creating them maps
  // its segment anew on shm each time) until unused for a minute. Destroyed
  // on the progress thread.
  struct Conn;
  KvHandoffSender(model::KvCache& cache, uint64_t id, bool tcp)
      : cache_(cache), id_(id), tcp_(tcp) {}
  // KvHandoffWrite::Finish.
  absl::StatusOr<uint32_t> FinishWrite(KvHandoffWrite& write);
  // Progress thread only: forgets the connection (closed once no Send
  // holds it).
  void DropConn(const std::string& address);
  // Progress thread only (the ticker): forgets connections unused for
  // `idle`, so a dead decode side's segment is not kept mapped here.
  void ExpireConns(absl::Duration idle);
  // Progress thread only: the live connection to the target, made anew when
  // there is none, it failed, or the target's rkey changed.
  absl::StatusOr<std::shared_ptr<Conn>> Connection(const KvHandoffTarget& target);
  // The landed messages of KvLandingPads (kKvAmLanded).
  absl::Status RegisterLanded();
  static ucs_status_t OnLanded(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param);

  model::KvCache& cache_;
  const uint64_t id_;  // random: tells this sender's hand-offs from others' at a receiver
  const bool tcp_;     // the context's profile
  std::unique_ptr<UcxMemoryRegion> region_;
  std::unique_ptr<UcxWorker> worker_;
  std::unique_ptr<ChecksumWorker> copier_;  // the second core of a mapped copy
  std::atomic<int> in_flight_{0};           // writes under way: keep progressing
  // Progress thread only: connections by worker address; hand-offs waiting
  // for their landed message, by seq.
  std::map<std::string, std::shared_ptr<Conn>> conns_;
  absl::Time next_sweep_ = absl::InfinitePast();
  uint64_t next_seq_ = 0;
  std::map<uint64_t, std::shared_ptr<KvSendState>> pending_;
};

// One write under way (KvHandoffSender::Start). Not thread-safe: one
// thread finishes it. The sender must outlive it.
class KvHandoffWrite {
 public:
  // Finishes the write if Finish was not called (its source blocks are
  // read until then; bounded by its deadline).
  ~KvHandoffWrite();
  KvHandoffWrite(const KvHandoffWrite&) = delete;
  KvHandoffWrite& operator=(const KvHandoffWrite&) = delete;

  KvHandoffPath path() const { return path_; }
  // Before Finish: every byte is written (remotely complete, or copied into
  // the mapped target) or the write failed; Finish then returns at once.
  // The bytes move without Finish; it only waits. Thread-safe.
  bool settled() const;
  // Waits until the write is remotely complete (a mapped target: helps
  // copy) and returns as SendLayers: the CRC32C of the bytes moved,
  // DeadlineExceeded past the deadline, Unavailable when the peer was lost.
  // Once only (FailedPrecondition after).
  [[nodiscard]] absl::StatusOr<uint32_t> Finish();

 private:
  friend class KvHandoffSender;
  explicit KvHandoffWrite(KvHandoffSender& sender) : sender_(sender) {}

  KvHandoffSender& sender_;
  std::string address_;  // the target's worker
  std::vector<KvSegment> segments_;
  Deadline deadline_ = Deadline::After(absl::ZeroDuration());
  KvHandoffPath path_ = KvHandoffPath::kRendezvous;
  bool finished_ = false;
  // Mapped: the copy under way and the connection whose mapping it writes
  // (released on the progress thread).
  std::shared_ptr<KvSegmentCopy> copy_;
  std::shared_ptr<KvHandoffSender::Conn> conn_;
  // Otherwise: the operations' outcome and the hand-off's sequence number.
  std::shared_ptr<KvSendState> state_;
  uint64_t seq_ = 0;
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_KV_HANDOFF_H_
