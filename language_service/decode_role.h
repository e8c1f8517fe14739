// Role decode (role.h): reserves KV blocks for requests a prefill
// instance hands over; every rank of the instance registers its own KV cache
// with UCX and receives only its KV heads (worker/tp_kv_receiver.h). Each
// rank's cache lives in its KV receiver (KvHandoffReceiver::CreateWithCache):
// on the shm profile a UCX shared segment that prefill instances on this
// host map and copy into themselves (transfer/kv_handoff.h, the mapped
// path); on tcp private memory, as before. Its calls (DecodeCalls: the
// Decode stream, AllocateKv, CommitKv) come from gRPC threads and run on
// the loop thread; everything else is the loop thread's.
#ifndef MMSERVE_LANGUAGE_SERVICE_DECODE_ROLE_H_
#define MMSERVE_LANGUAGE_SERVICE_DECODE_ROLE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "language_service/role.h"
#include "transfer/wire_bytes.h"
#include "worker/tp_kv_receiver.h"

namespace mmserve::language {

class DecodeRole final : public Role, public DecodeCalls {
 public:
  // `bytes` counts the KV handed over (received, once its CRC32Cs match).
  DecodeRole(const RoleOptions& options, std::string instance_id, transfer::WireBytes bytes)
      : options_(options), instance_id_(std::move(instance_id)), bytes_(bytes) {}

  // Rank 0's KV cache placed in its receiver; shard ranks receive their
  // heads over the same transport profile.
  absl::Status AdjustEngineOptions(worker::EngineOptions& options) const override;
  std::unique_ptr<worker::KvConnector> MakeConnector() const override {
    return std::make_unique<worker::DecodeKvConnector>(
        worker::DecodeKvConnector::Options{.commit_timeout = options_.kv_commit_timeout});
  }
  absl::Status Attach(RoleHost& host) override;
  absl::Status CheckPrefill(const v1::PrefillRequest& request) const override {
    return absl::FailedPreconditionError("role decode takes Decode calls, not Prefill");
  }
  DecodeCalls* decode_calls() override { return this; }

  absl::Status Decode(const v1::DecodeRequest& request, RequestSink sink) override;
  absl::StatusOr<v1::KvAllocation> AllocateKv(const v1::KvAllocateRequest& request) override;
  absl::Status CommitKv(const v1::KvCommit& commit) override;

 private:
  // AllocateKv and CommitKv on the loop thread.
  absl::StatusOr<v1::KvAllocation> Reserve(const v1::KvAllocateRequest& request);
  absl::Status Commit(const v1::KvCommit& commit);
  // The answer to AllocateKv for blocks reserved in the engine, after the
  // engine's earlier reads of them have finished on every rank.
  absl::StatusOr<v1::KvAllocation> Allocation(const v1::KvAllocateRequest& request,
                                              const worker::RemoteKvBlocks& blocks);
  // The committed KV is what the prefill instance wrote (every rank's
  // CRC32C of its own heads): DataLoss when not. InvalidArgument for a
  // commit of the wrong shape (not one CRC32C per rank).
  absl::Status CheckCommit(const v1::KvCommit& commit, const std::vector<int32_t>& blocks);

  // Rank 0's receiver, which owns the engine's KV cache, and its context;
  // made when the engine places its cache. Shared with the engine (an
  // aliasing pointer to the cache), so whichever goes last frees them.
  struct Rank0Kv {
    std::unique_ptr<transfer::UcxContext> context;
    std::unique_ptr<transfer::KvHandoffReceiver> receiver;  // goes first
  };

  const RoleOptions options_;
  const std::string instance_id_;
  RoleHost* host_ = nullptr;
  const std::shared_ptr<Rank0Kv> rank0_ = std::make_shared<Rank0Kv>();
  const transfer::WireBytes bytes_;
  std::unique_ptr<worker::TpKvReceivers> kv_receivers_;
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_DECODE_ROLE_H_
