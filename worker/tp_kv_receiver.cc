#include "worker/tp_kv_receiver.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mmserve::worker {
namespace {

// A rank's target in a Gather: one byte per float (exact in fp32):
// [address length u32][address][rkey length u32][rkey][base address u64]
// [shape: layers, blocks, block size, KV heads, head dim, i64 each].
constexpr size_t kTargetFloats = 8192;
// A rank's check in a Gather: [ok][crc byte 0..3].
constexpr size_t kCheckFloats = 5;

void PutBytes(const void* p, size_t n, std::vector<float>* out) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) out->push_back(static_cast<float>(b[i]));
}

absl::StatusOr<std::vector<float>> EncodeTarget(const transfer::KvHandoffTarget& t) {
  std::vector<float> out;
  for (const std::string* s : {&t.worker_address, &t.rkey}) {
    const uint32_t n = static_cast<uint32_t>(s->size());
    PutBytes(&n, sizeof(n), &out);
    PutBytes(s->data(), s->size(), &out);
  }
  PutBytes(&t.base_address, sizeof(t.base_address), &out);
  for (int64_t v : {t.shape.num_layers, t.shape.num_blocks, t.shape.block_size,
                    t.shape.num_kv_heads, t.shape.head_dim}) {
    PutBytes(&v, sizeof(v), &out);
  }
  if (out.size() > kTargetFloats) {
    return absl::InternalError(absl::StrCat("a KV target of ", out.size(), " bytes exceeds ",
                                            kTargetFloats, " (UCX address or rkey too long)"));
  }
  out.resize(kTargetFloats, 0.0f);
  return out;
}

// Reads n bytes at *at of `in`; false past its end.
bool GetBytes(absl::Span<const float> in, size_t* at, void* p, size_t n) {
  if (n > in.size() || *at > in.size() - n) return false;
  auto* b = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(in[*at + i]);
  *at += n;
  return true;
}

absl::StatusOr<transfer::KvHandoffTarget> DecodeTarget(absl::Span<const float> in) {
  transfer::KvHandoffTarget t;
  size_t at = 0;
  for (std::string* s : {&t.worker_address, &t.rkey}) {
    uint32_t n = 0;
    if (!GetBytes(in, &at, &n, sizeof(n)) || n == 0) {
      return absl::InternalError("a rank sent a malformed KV target");
    }
    s->resize(n);
    if (!GetBytes(in, &at, s->data(), n)) {
      return absl::InternalError("a rank sent a malformed KV target");
    }
  }
  if (!GetBytes(in, &at, &t.base_address, sizeof(t.base_address))) {
    return absl::InternalError("a rank sent a malformed KV target");
  }
  for (int64_t* v : {&t.shape.num_layers, &t.shape.num_blocks, &t.shape.block_size,
                     &t.shape.num_kv_heads, &t.shape.head_dim}) {
    if (!GetBytes(in, &at, v, sizeof(*v))) {
      return absl::InternalError("a rank sent a malformed KV target");
    }
  }
  return t;
}

absl::Status CheckBlocks(const model::KvCache& kv, const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    if (b < 0 || b >= kv.shape().num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("block ", b, " outside the cache's ", kv.shape().num_blocks));
    }
  }
  return absl::OkStatus();
}

// This rank's part of a kKvCheck: fence, then the CRC (ok = 0 on failure).
std::vector<float> LocalCheck(transfer::KvHandoffReceiver& rx, const model::KvCache& kv,
                              const std::vector<int32_t>& blocks, absl::Status* status) {
  *status = rx.AwaitLandedWrites();
  if (status->ok()) *status = CheckBlocks(kv, blocks);
  std::vector<float> out;
  out.push_back(status->ok() ? 1.0f : 0.0f);
  const uint32_t crc = status->ok() ? transfer::KvBlocksCrc(kv, blocks) : 0;
  PutBytes(&crc, sizeof(crc), &out);
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TpKvReceivers>> TpKvReceivers::Create(
    std::shared_ptr<transfer::KvHandoffReceiver> rank0, StepRing* ring, Communicator* comm) {
  if ((ring == nullptr) != (comm == nullptr)) {
    return absl::InvalidArgumentError("TpKvReceivers needs both the step ring and communicator");
  }
  if (rank0 == nullptr || rank0->owned_cache() == nullptr) {
    return absl::InvalidArgumentError("TpKvReceivers needs rank 0's receiver with its cache");
  }
  std::unique_ptr<TpKvReceivers> r(new TpKvReceivers(std::move(rank0), ring, comm));
  const model::KvCache& kv = r->kv_;
  r->targets_.push_back(r->receiver_->target());
  if (comm == nullptr || comm->world_size() == 1) return r;
  StepMessage m;
  m.kind = StepKind::kKvRegister;
  RETURN_IF_ERROR(ring->Publish(m));
  ASSIGN_OR_RETURN(std::vector<float> mine, EncodeTarget(r->targets_[0]));
  std::vector<float> all(kTargetFloats * comm->world_size());
  RETURN_IF_ERROR(comm->Gather(mine, absl::MakeSpan(all)));
  for (int rank = 1; rank < comm->world_size(); ++rank) {
    ASSIGN_OR_RETURN(transfer::KvHandoffTarget t, DecodeTarget(absl::MakeConstSpan(all).subspan(
                                                      rank * kTargetFloats, kTargetFloats)));
    const model::KvCacheShape& a = t.shape;
    const model::KvCacheShape& b = kv.shape();
    // Every rank holds the same blocks of as many heads (the head slices).
    if (a.num_layers != b.num_layers || a.num_blocks != b.num_blocks ||
        a.block_size != b.block_size || a.num_kv_heads != b.num_kv_heads ||
        a.head_dim != b.head_dim) {
      return absl::InternalError(absl::StrCat("rank ", rank, "'s KV cache has ", a.num_blocks,
                                              " blocks x ", a.num_kv_heads, " heads; rank 0's ",
                                              b.num_blocks, " x ", b.num_kv_heads));
    }
    r->targets_.push_back(std::move(t));
  }
  return r;
}

absl::StatusOr<std::vector<uint32_t>> TpKvReceivers::Check(const std::vector<int32_t>& blocks) {
  RETURN_IF_ERROR(CheckBlocks(kv_, blocks));
  absl::Status local;
  std::vector<float> mine = LocalCheck(*receiver_, kv_, blocks, &local);
  RETURN_IF_ERROR(local);
  if (comm_ == nullptr || comm_->world_size() == 1) {
    return std::vector<uint32_t>{transfer::KvBlocksCrc(kv_, blocks)};
  }
  StepMessage m;
  m.kind = StepKind::kKvCheck;
  if (!blocks.empty()) {
    m.batch.sequences.emplace_back();
    m.batch.sequences.back().block_table = blocks;
  }
  // The other ranks fence after this one did: each fences its own receiver.
  RETURN_IF_ERROR(ring_->Publish(m));
  std::vector<float> all(kCheckFloats * comm_->world_size());
  RETURN_IF_ERROR(comm_->Gather(mine, absl::MakeSpan(all)));
  std::vector<uint32_t> crcs;
  for (int rank = 0; rank < comm_->world_size(); ++rank) {
    absl::Span<const float> part = absl::MakeConstSpan(all).subspan(rank * kCheckFloats);
    if (part[0] != 1.0f) {
      return absl::InternalError(absl::StrCat("rank ", rank, " could not check its KV blocks"));
    }
    uint32_t crc = 0;
    size_t at = 1;
    GetBytes(part, &at, &crc, sizeof(crc));
    crcs.push_back(crc);
  }
  return crcs;
}

absl::StatusOr<model::KvCache*> ShardKvReceiver::Allocate(const model::KvCacheShape& shape) {
  receiver_.reset();
  ASSIGN_OR_RETURN(receiver_,
                   transfer::KvHandoffReceiver::CreateWithCache(context_, shape, options_));
  return receiver_->owned_cache();
}

absl::Status ShardKvReceiver::Register(model::KvCache& kv) {
  if (receiver_ == nullptr || receiver_->owned_cache() != &kv) {
    receiver_.reset();  // a cache the loop made: expose it where it lies
    ASSIGN_OR_RETURN(receiver_, transfer::KvHandoffReceiver::Create(context_, kv, options_));
  }
  ASSIGN_OR_RETURN(std::vector<float> mine, EncodeTarget(receiver_->target()));
  return comm_.Gather(mine, {});
}

absl::Status ShardKvReceiver::Check(model::KvCache& kv, const std::vector<int32_t>& blocks) {
  if (receiver_ == nullptr) {
    return absl::FailedPreconditionError("a kKvCheck step before kKvRegister");
  }
  absl::Status local;
  std::vector<float> mine = LocalCheck(*receiver_, kv, blocks, &local);
  // Rank 0 reports a failed check; this rank stays in service.
  return comm_.Gather(mine, {});
}

}  // namespace mmserve::worker
