// KV hand-off into a tensor-parallel decode instance: every
// rank registers its own KV cache (its KV heads only) with UCX, and the
// prefill instance writes each rank its head slice of every layer directly
// (KvHandoffSender::Send with first_head), so no rank relays another's
// bytes. Rank 0 learns the other ranks' targets, and later their CRC32C of a
// request's blocks, through the instance's step ring (a kKvRegister or
// kKvCheck step, in order with the forwards) and a Gather on its
// communicator.
//
//   // rank 0 (the engine's step thread), once the caches are allocated (its
//   // own by a KvHandoffReceiver::CreateWithCache, see decode_role.h):
//   ASSIGN_OR_RETURN(auto rx, TpKvReceivers::Create(rank0_rx, ring, comm));
//   rx->targets();  // one per rank, rank order: into KvAllocation.ranks
//   ASSIGN_OR_RETURN(std::vector<uint32_t> crcs, rx->Check(blocks));  // on KvCommit
//   // ranks 1..n-1 (worker/tp_shard_main.cc):
//   ShardKvReceiver hooks(ctx, *comm, {.name = ...});  // makes the rank's cache
//   RETURN_IF_ERROR(RunShardSteps(*ring, model, {}, &hooks));
//
// With one rank (ring and comm null) TpKvReceivers is rank 0's receiver
// alone. Every rank's cache lives in its receiver (CreateWithCache): on the
// shm profile a segment the prefill instance maps and copies into. A rank
// that dies fails the gather with UNAVAILABLE (the communicator watches its
// peers), never a hang.
// Thread-safety: TpKvReceivers' calls and targets() on the thread that
// publishes steps; ShardKvReceiver on its rank's step thread.
#ifndef MMSERVE_WORKER_TP_KV_RECEIVER_H_
#define MMSERVE_WORKER_TP_KV_RECEIVER_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/communicator.h"
#include "model/kv_cache.h"
#include "transfer/kv_handoff.h"
#include "transfer/ucx_context.h"
#include "worker/step_ring.h"
#include "worker/tp_step_loop.h"

namespace mmserve::worker {

// Rank 0's side.
class TpKvReceivers {
 public:
  // Over rank 0's receiver `rank0` (its owned_cache() is rank 0's cache)
  // and, with `ring` and `comm` (more than one rank), has every other rank
  // expose its own cache and gathers their targets. Every rank's cache must
  // be allocated (kAllocateKv) already and keep its shape while this object
  // lives. InvalidArgument for a receiver that owns no cache.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TpKvReceivers>> Create(
      std::shared_ptr<transfer::KvHandoffReceiver> rank0, StepRing* ring, Communicator* comm);

  // One target per rank, rank order; target r holds KV heads
  // [r * heads, (r + 1) * heads) with heads = its shape's num_kv_heads.
  const std::vector<transfer::KvHandoffTarget>& targets() const { return targets_; }
  int size() const { return static_cast<int>(targets_.size()); }

  // On every rank: orders the hand-off writes landed so far before its
  // reads (KvHandoffReceiver::AwaitLandedWrites) and returns its
  // KvBlocksCrc of `blocks`, rank order. With no blocks, a fence only (call
  // it before handing out blocks the forwards read, and before reading
  // committed ones). InvalidArgument for a block out of range; UNAVAILABLE
  // when a rank is gone.
  [[nodiscard]] absl::StatusOr<std::vector<uint32_t>> Check(const std::vector<int32_t>& blocks);

 private:
  TpKvReceivers(std::shared_ptr<transfer::KvHandoffReceiver> receiver, StepRing* ring,
                Communicator* comm)
      : receiver_(std::move(receiver)), kv_(*receiver_->owned_cache()), ring_(ring), comm_(comm) {}

  std::shared_ptr<transfer::KvHandoffReceiver> receiver_;
  model::KvCache& kv_;  // in receiver_
  StepRing* ring_;
  Communicator* comm_;
  std::vector<transfer::KvHandoffTarget> targets_;
};

// Ranks 1..n-1: RunShardSteps' hooks over a KvHandoffReceiver of the rank's
// cache.
class ShardKvReceiver final : public ShardKvHooks {
 public:
  // `context` and `comm` must outlive it.
  ShardKvReceiver(transfer::UcxContext& context, Communicator& comm,
                  const transfer::UcxWorkerOptions& options)
      : context_(context), comm_(comm), options_(options) {}

  void Release() override { receiver_.reset(); }
  // The rank's cache in a receiver of its own (CreateWithCache).
  [[nodiscard]] absl::StatusOr<model::KvCache*> Allocate(const model::KvCacheShape& shape) override;
  [[nodiscard]] absl::Status Register(model::KvCache& kv) override;
  [[nodiscard]] absl::Status Check(model::KvCache& kv, const std::vector<int32_t>& blocks) override;

 private:
  transfer::UcxContext& context_;
  Communicator& comm_;
  const transfer::UcxWorkerOptions options_;
  std::unique_ptr<transfer::KvHandoffReceiver> receiver_;
};

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_TP_KV_RECEIVER_H_
