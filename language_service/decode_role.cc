#include "language_service/decode_role.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "language_service/kv_bytes_moved.h"
#include "model/sampling_proto.h"

namespace mmserve::language {

absl::Status DecodeRole::AdjustEngineOptions(worker::EngineOptions& options) const {
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
  return absl::OkStatus();
}

absl::Status DecodeRole::Attach(RoleHost& host) {
  host_ = &host;
  worker::LlmEngine& engine = host.engine();
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

absl::Status DecodeRole::Decode(const v1::DecodeRequest& request, RequestSink sink) {
  if (request.request_id().empty()) return absl::InvalidArgumentError("request_id is empty");
  auto r = std::make_unique<LiveRequest>();
  r->id = request.request_id();
  r->phase = RequestPhase::kRegistered;
  r->sink = std::move(sink);
  r->engine_request.id = r->id;
  const worker::LlmEngine& engine = host_->engine();  // its config and sizing are constant
  ASSIGN_OR_RETURN(
      r->engine_request.sampling,
      model::SamplingFromProto(request.sampling(), engine.config(), engine.sizing().max_model_len,
                               &r->engine_request.max_tokens_to_context));
  r->include_usage = !request.stream().has_include_usage() || request.stream().include_usage();
  return host_->Install(std::move(r));  // the core's install: an empty first batch
}

absl::StatusOr<v1::KvAllocation> DecodeRole::AllocateKv(const v1::KvAllocateRequest& request) {
  if (request.prompt_token_ids_size() == 0) {
    return absl::InvalidArgumentError("AllocateKv needs the prompt's token ids");
  }
  return host_->Call<absl::StatusOr<v1::KvAllocation>>(
      [this, &request] { return Reserve(request); });
}

absl::StatusOr<v1::KvAllocation> DecodeRole::Reserve(const v1::KvAllocateRequest& request) {
  LiveRequest* found = host_->Find(request.request_id());
  if (found == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", request.request_id(), " has no open Decode call here"));
  }
  LiveRequest& r = *found;
  if (r.phase != RequestPhase::kRegistered) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", r.id, " already has its KV allocated"));
  }
  worker::EngineRequest er = r.engine_request;
  er.prompt_token_ids.assign(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
  er.sampling.seed = request.seed();
  ASSIGN_OR_RETURN(er.handoff_images, HandoffImagesFromProto(request));
  uint32_t image_tokens = 0;
  for (const worker::HandoffMedia& h : er.handoff_images) {
    image_tokens += static_cast<uint32_t>(h.grid.num_tokens());
  }
  r.engine_request.sampling.seed = request.seed();
  worker::RemoteKvBlocks blocks;  // the commit deadline is the engine's DecodeKvConnector's
  RETURN_IF_ERROR(host_->engine().AddRequest(
      std::move(er), [host = host_](const worker::StreamEvent& e) { host->OnEvent(e); }, &blocks));
  Advance(r, RequestEvent::kKvReserved);
  r.kv_blocks = blocks.blocks;
  r.admitted_at_s = r.since_submit.ElapsedSeconds();
  r.mrope_position_delta = blocks.mrope_position_delta;
  r.image_tokens = image_tokens;  // er has moved into the engine
  if (blocks.mrope_position_delta != request.mrope_position_delta()) {
    const absl::Status why = absl::InvalidArgumentError(
        absl::StrCat("request ", r.id, ": M-RoPE delta ", request.mrope_position_delta(),
                     " disagrees with the images' ", blocks.mrope_position_delta));
    host_->End(r.id, why);  // frees the reservation
    return why;
  }
  return Allocation(request, blocks);
}

absl::Status DecodeRole::CommitKv(const v1::KvCommit& commit) {
  return host_->Call<absl::Status>([this, &commit] { return Commit(commit); });
}

absl::Status DecodeRole::Commit(const v1::KvCommit& commit) {
  LiveRequest* found = host_->Find(commit.request_id());
  if (found == nullptr || !InEngine(found->phase)) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", commit.request_id(), " has no KV allocated here"));
  }
  LiveRequest& r = *found;
  if (r.phase != RequestPhase::kAwaitingKv) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", r.id, " has no KV commit pending"));
  }
  if (commit.mrope_position_delta() != r.mrope_position_delta) {
    const absl::Status why = absl::InvalidArgumentError(
        absl::StrCat("request ", r.id, ": committed M-RoPE delta ", commit.mrope_position_delta(),
                     " != allocated ", r.mrope_position_delta));
    host_->End(r.id, why);
    return why;
  }
  if (absl::Status s = CheckCommit(commit, r.kv_blocks); !s.ok()) {
    // A commit of the wrong shape leaves the reservation to a right one.
    if (!absl::IsInvalidArgument(s)) host_->End(r.id, s);
    return s;
  }
  const std::string id = r.id;
  RETURN_IF_ERROR(
      host_->engine().CommitRemoteKv(id, static_cast<int32_t>(commit.first_token_id())));
  // The first token may have ended the request already (its final event
  // came from CommitRemoteKv).
  if (LiveRequest* held = host_->Find(id)) Advance(*held, RequestEvent::kKvCommitted);
  return absl::OkStatus();
}

}  // namespace mmserve::language
