#include "language_service/decode_role.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "language_service/kv_bytes_moved.h"

namespace mmserve::language {

void DecodeRole::AdjustEngineOptions(worker::EngineOptions& options) const {
  options.kv_cache_placement =
      [kv = rank0_, profile = options_.kv_profile, name = instance_id_ + "-kv"](
          const model::KvCacheShape& shape) -> absl::StatusOr<std::shared_ptr<model::KvCache>> {
    ASSIGN_OR_RETURN(kv->context, transfer::UcxContext::Create(profile));
    ASSIGN_OR_RETURN(kv->receiver, transfer::KvHandoffReceiver::CreateWithCache(*kv->context, shape,
                                                                                {.name = name}));
    return std::shared_ptr<model::KvCache>(kv, kv->receiver->owned_cache());
  };
  if (options.tp_size > 1) {
    options.tp_shard_args.push_back(
        absl::StrCat("--kv_handoff_profile=", transfer::TransportProfileName(options_.kv_profile)));
  }
}

absl::Status DecodeRole::Attach(worker::LlmEngine& engine) {
  if (rank0_->receiver == nullptr || rank0_->receiver->owned_cache() != &engine.kv_cache()) {
    return absl::InternalError("role decode: the engine's KV cache is not in its receiver");
  }
  // Every rank receives its own KV heads (worker/tp_kv_receiver.h).
  worker::TpGroup* group = engine.tp_group();
  ASSIGN_OR_RETURN(
      kv_receivers_,
      worker::TpKvReceivers::Create(
          std::shared_ptr<transfer::KvHandoffReceiver>(rank0_, rank0_->receiver.get()),
          group != nullptr ? group->ring() : nullptr, group != nullptr ? group->comm() : nullptr));
  return absl::OkStatus();
}

absl::StatusOr<v1::KvAllocation> DecodeRole::Allocation(const v1::KvAllocateRequest& request,
                                                        const worker::RemoteKvBlocks& blocks) {
  // The engine's earlier reads of these (reused) blocks before the puts, on
  // every rank. (On failure the reservation ends at its commit deadline.)
  RETURN_IF_ERROR(kv_receivers_->Check({}).status());
  v1::KvAllocation a;
  a.set_request_id(request.request_id());
  a.set_num_tokens(static_cast<uint32_t>(request.prompt_token_ids_size()));
  a.set_num_cached_tokens(static_cast<uint32_t>(blocks.num_cached_tokens));
  const int tp = kv_receivers_->size();
  for (int i = 0; i < tp; ++i) {
    const transfer::KvHandoffTarget& t = kv_receivers_->targets()[i];
    v1::KvRankTarget* rank = a.add_ranks();
    rank->mutable_peer()->set_worker_address(t.worker_address);
    rank->mutable_peer()->set_transport_profile(
        transfer::TransportProfileName(options_.kv_profile));
    rank->mutable_peer()->set_host(transfer::HostIdentity());
    v1::KvLayout* l = rank->mutable_layout();
    l->set_num_layers(static_cast<uint32_t>(t.shape.num_layers));
    l->set_num_kv_heads(static_cast<uint32_t>(t.shape.num_kv_heads));
    l->set_head_dim(static_cast<uint32_t>(t.shape.head_dim));
    l->set_block_size(static_cast<uint32_t>(t.shape.block_size));
    l->set_num_blocks(static_cast<uint32_t>(t.shape.num_blocks));
    l->set_dtype(v1::TENSOR_DTYPE_FLOAT32);
    l->set_tp_rank(static_cast<uint32_t>(i));
    l->set_tp_size(static_cast<uint32_t>(tp));
    rank->mutable_kv_region()->set_base_address(t.base_address);
    rank->mutable_kv_region()->set_length(t.shape.TotalBytes());
    rank->mutable_kv_region()->set_rkey(t.rkey);
    // Every rank's cache has the same blocks (of its own heads).
    for (int32_t b : blocks.blocks) rank->add_block_ids(static_cast<uint32_t>(b));
  }
  return a;
}

absl::Status DecodeRole::CheckCommit(const v1::KvCommit& commit,
                                     const std::vector<int32_t>& blocks) {
  if (commit.rank_crc32c_size() != kv_receivers_->size()) {
    return absl::InvalidArgumentError(absl::StrCat("KvCommit needs one CRC32C per rank (",
                                                   kv_receivers_->size(), "), got ",
                                                   commit.rank_crc32c_size()));
  }
  // Every rank fences its landed writes and checks its own heads.
  ASSIGN_OR_RETURN(std::vector<uint32_t> crcs, kv_receivers_->Check(blocks));
  for (int i = 0; i < kv_receivers_->size(); ++i) {
    if (crcs[i] != commit.rank_crc32c(i)) {
      return absl::DataLossError(absl::StrCat("request ", commit.request_id(),
                                              ": KV CRC32C of rank ", i, " ", crcs[i],
                                              " != committed ", commit.rank_crc32c(i)));
    }
  }
  // Every rank received its heads of each block.
  for (const transfer::KvHandoffTarget& t : kv_receivers_->targets()) {
    bytes_.Received(blocks.size() * HandoffBlockBytes(t.shape));
  }
  return absl::OkStatus();
}

}  // namespace mmserve::language
