#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "language_service/language_core.h"
#include "language_service/language_core_request.h"
#include "model/chat_template.h"
#include "model/sampling_proto.h"
#include "proto/encoder.grpc.pb.h"

namespace mmserve::language {

namespace {

// The images of a handed-off prompt, for LlmEngine::AddRequest (which
// checks them against the token ids).
absl::StatusOr<std::vector<worker::HandoffImage>> HandoffImagesFromProto(
    const v1::KvAllocateRequest& request) {
  constexpr uint32_t kMaxSide = 1 << 16;  // patches; keeps t * h * w in range
  std::vector<worker::HandoffImage> out;
  for (const v1::KvImageSpan& s : request.images()) {
    if (s.offset() >= static_cast<uint32_t>(request.prompt_token_ids_size()) || s.grid_t() == 0 ||
        s.grid_h() == 0 || s.grid_w() == 0 || s.grid_t() > kMaxSide || s.grid_h() > kMaxSide ||
        s.grid_w() > kMaxSide) {
      return absl::InvalidArgumentError(
          absl::StrCat("hand-off image ", out.size(), " has offset ", s.offset(), " and grid ",
                       s.grid_t(), "x", s.grid_h(), "x", s.grid_w(), " for a prompt of ",
                       request.prompt_token_ids_size(), " tokens"));
    }
    worker::HandoffImage h;
    h.offset = static_cast<int>(s.offset());
    h.grid = model::ImageGrid::FromThw(static_cast<int>(s.grid_t()), static_cast<int>(s.grid_h()),
                                       static_cast<int>(s.grid_w()));
    h.key = ContentHash{s.content_hash().high(), s.content_hash().low()};
    out.push_back(h);
  }
  return out;
}

}  // namespace

absl::Status LanguageCore::RegisterDecode(const v1::DecodeRequest& request, RequestSink sink) {
  if (options_.role != LanguageRole::kDecode) {
    return absl::UnimplementedError("only role decode takes Decode calls (use --role=decode)");
  }
  if (request.request_id().empty()) return absl::InvalidArgumentError("request_id is empty");
  auto r = std::make_unique<Request>();
  r->id = request.request_id();
  r->sink = std::move(sink);
  r->engine_request.id = r->id;
  ASSIGN_OR_RETURN(
      r->engine_request.sampling,
      model::SamplingFromProto(request.sampling(), config(), engine_->sizing().max_model_len,
                               &r->engine_request.max_tokens_to_context));
  r->include_usage = !request.stream().has_include_usage() || request.stream().include_usage();
  return Install(std::move(r), [](Request& held) {
    // An empty first batch: the request is held here, AllocateKv may come.
    v1::TokenBatch registered;
    registered.set_request_id(held.id);
    held.sink.on_batch(std::move(registered));
  });
}

absl::StatusOr<v1::KvAllocation> LanguageCore::AllocateKv(const v1::KvAllocateRequest& request) {
  if (options_.role != LanguageRole::kDecode) {
    return absl::UnimplementedError("only role decode takes KV hand-offs (use --role=decode)");
  }
  if (request.prompt_token_ids_size() == 0) {
    return absl::InvalidArgumentError("AllocateKv needs the prompt's token ids");
  }
  return RunOnLoop<absl::StatusOr<v1::KvAllocation>>(
      [this, &request]() -> absl::StatusOr<v1::KvAllocation> {
        auto it = requests_.find(request.request_id());
        if (it == requests_.end()) {
          return absl::FailedPreconditionError(
              absl::StrCat("request ", request.request_id(), " has no open Decode call here"));
        }
        Request& r = *it->second;
        if (r.in_engine) {
          return absl::FailedPreconditionError(
              absl::StrCat("request ", r.id, " already has its KV allocated"));
        }
        worker::EngineRequest er = r.engine_request;
        er.prompt_token_ids.assign(request.prompt_token_ids().begin(),
                                   request.prompt_token_ids().end());
        er.sampling.seed = request.seed();
        ASSIGN_OR_RETURN(er.handoff_images, HandoffImagesFromProto(request));
        uint32_t image_tokens = 0;
        for (const worker::HandoffImage& h : er.handoff_images) {
          image_tokens += static_cast<uint32_t>(h.grid.num_tokens());
        }
        r.engine_request.sampling.seed = request.seed();
        worker::RemoteKvBlocks blocks;  // commit deadline: the engine's DecodeKvConnector
        RETURN_IF_ERROR(engine_->AddRequest(
            std::move(er), [this](const worker::StreamEvent& e) { OnEvent(e); }, &blocks));
        r.in_engine = true;
        r.kv_blocks = blocks.blocks;
        r.admitted_at_s = r.since_submit.ElapsedSeconds();
        r.mrope_position_delta = blocks.mrope_position_delta;
        r.image_tokens = image_tokens;  // er has moved into the engine
        if (blocks.mrope_position_delta != request.mrope_position_delta()) {
          const absl::Status why = absl::InvalidArgumentError(
              absl::StrCat("request ", r.id, ": M-RoPE delta ", request.mrope_position_delta(),
                           " disagrees with the images' ", blocks.mrope_position_delta));
          End(r.id, why);  // frees the reservation
          return why;
        }
        // The engine's earlier reads of these (reused) blocks before the
        // puts, on every rank.
        // (On failure the reservation ends at its commit deadline.)
        RETURN_IF_ERROR(kv_receivers_->Check({}).status());
        v1::KvAllocation a;
        a.set_request_id(r.id);
        a.set_num_tokens(static_cast<uint32_t>(request.prompt_token_ids_size()));
        a.set_num_cached_tokens(static_cast<uint32_t>(blocks.num_cached_tokens));
        const int tp = kv_receivers_->size();
        for (int i = 0; i < tp; ++i) {
          const transfer::KvHandoffTarget& t = kv_receivers_->targets()[i];
          v1::KvRankTarget* rank = a.add_ranks();
          rank->mutable_peer()->set_worker_address(t.worker_address);
          rank->mutable_peer()->set_transport_profile(
              transfer::TransportProfileName(options_.kv_profile));
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
      });
}

absl::Status LanguageCore::CommitKv(const v1::KvCommit& commit) {
  if (options_.role != LanguageRole::kDecode) {
    return absl::UnimplementedError("only role decode takes KV hand-offs (use --role=decode)");
  }
  return RunOnLoop<absl::Status>([this, &commit]() -> absl::Status {
    auto it = requests_.find(commit.request_id());
    if (it == requests_.end() || !it->second->in_engine) {
      return absl::FailedPreconditionError(
          absl::StrCat("request ", commit.request_id(), " has no KV allocated here"));
    }
    Request& r = *it->second;
    if (commit.mrope_position_delta() != r.mrope_position_delta) {
      const absl::Status why = absl::InvalidArgumentError(
          absl::StrCat("request ", r.id, ": committed M-RoPE delta ", commit.mrope_position_delta(),
                       " != allocated ", r.mrope_position_delta));
      End(r.id, why);
      return why;
    }
    if (commit.rank_crc32c_size() != kv_receivers_->size()) {
      return absl::InvalidArgumentError(absl::StrCat("KvCommit needs one CRC32C per rank (",
                                                     kv_receivers_->size(), "), got ",
                                                     commit.rank_crc32c_size()));
    }
    // Every rank fences its landed writes and checks its own heads.
    absl::StatusOr<std::vector<uint32_t>> crcs = kv_receivers_->Check(r.kv_blocks);
    if (!crcs.ok()) {
      End(r.id, crcs.status());
      return crcs.status();
    }
    for (int i = 0; i < kv_receivers_->size(); ++i) {
      if ((*crcs)[i] != commit.rank_crc32c(i)) {
        const absl::Status why =
            absl::DataLossError(absl::StrCat("request ", r.id, ": KV CRC32C of rank ", i, " ",
                                             (*crcs)[i], " != committed ", commit.rank_crc32c(i)));
        End(r.id, why);
        return why;
      }
    }
    return engine_->CommitRemoteKv(r.id, static_cast<int32_t>(commit.first_token_id()));
  });
}

absl::Status LanguageCore::HandOff(Request& r, const std::vector<int32_t>& blocks,
                                   const worker::HandoffPrompt& prompt) {
  const Deadline deadline = Deadline::After(options_.kv_handoff_timeout);
  const auto grpc_deadline =
      std::chrono::system_clock::now() + absl::ToChronoNanoseconds(options_.kv_handoff_timeout);
  auto& stub = decode_stubs_[r.decode.address()];
  if (stub == nullptr) stub = v1::Language::NewStub(InternalChannel(r.decode.address()));
  const std::vector<int32_t>& ids = prompt.token_ids;
  v1::KvAllocateRequest req;
  req.set_request_id(r.id);
  req.set_num_tokens(static_cast<uint32_t>(ids.size()));
  req.set_max_new_tokens(static_cast<uint32_t>(r.engine_request.sampling.max_tokens));
  for (int32_t t : ids) req.add_prompt_token_ids(static_cast<uint32_t>(t));
  req.set_seed(r.engine_request.sampling.seed);
  for (const worker::HandoffImage& h : prompt.images) {
    v1::KvImageSpan* span = req.add_images();
    span->set_offset(static_cast<uint32_t>(h.offset));
    span->set_grid_t(static_cast<uint32_t>(h.grid.grid_t));
    span->set_grid_h(static_cast<uint32_t>(h.grid.grid_h));
    span->set_grid_w(static_cast<uint32_t>(h.grid.grid_w));
    span->mutable_content_hash()->set_high(h.key.high);
    span->mutable_content_hash()->set_low(h.key.low);
  }
  req.set_mrope_position_delta(prompt.mrope_position_delta);
  v1::KvAllocation alloc;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(grpc_deadline);
    RETURN_IF_ERROR(FromGrpcStatus(stub->AllocateKv(&ctx, req, &alloc)));
  }
  // One put set per decode rank, each its slice of the KV heads.
  const int64_t heads = engine_->kv_cache().shape().num_kv_heads;
  const int tp = alloc.ranks_size();
  if (tp < 1 || heads % tp != 0) {
    return absl::InternalError(
        absl::StrCat("the decode instance has ", tp, " ranks for ", heads, " KV heads"));
  }
  // The decode side's block size (Send refuses one that differs from ours).
  const int64_t block_size = alloc.ranks(0).layout().block_size();
  const size_t skip = alloc.num_cached_tokens() / std::max<int64_t>(1, block_size);
  if (options_.test_kv_handoff_delay > absl::ZeroDuration()) {
    LOG(WARNING) << "request " << r.id << ": test-only hand-off delay of "
                 << options_.test_kv_handoff_delay << " after AllocateKv";
    absl::SleepFor(options_.test_kv_handoff_delay);
  }
  v1::KvCommit commit;
  for (int i = 0; i < tp; ++i) {
    const v1::KvRankTarget& rank = alloc.ranks(i);
    if (rank.layout().tp_rank() != static_cast<uint32_t>(i) ||
        rank.layout().tp_size() != static_cast<uint32_t>(tp) ||
        rank.layout().num_kv_heads() * tp != heads) {
      return absl::InternalError(absl::StrCat("the decode instance's rank ", i, " holds ",
                                              rank.layout().num_kv_heads(), " KV heads as rank ",
                                              rank.layout().tp_rank(), " of ",
                                              rank.layout().tp_size(), "; ", heads, " to split"));
    }
    transfer::KvHandoffTarget target;
    target.worker_address = rank.peer().worker_address();
    target.rkey = rank.kv_region().rkey();
    target.base_address = rank.kv_region().base_address();
    target.shape.num_layers = rank.layout().num_layers();
    target.shape.num_blocks = rank.layout().num_blocks();
    target.shape.block_size = rank.layout().block_size();
    target.shape.num_kv_heads = rank.layout().num_kv_heads();
    target.shape.head_dim = rank.layout().head_dim();
    if (skip > blocks.size() ||
        blocks.size() - skip != static_cast<size_t>(rank.block_ids_size())) {
      return absl::InternalError(absl::StrCat("the decode instance allocated ",
                                              rank.block_ids_size(), " blocks after ", skip,
                                              " cached for a prompt of ", blocks.size()));
    }
    std::vector<int32_t> src(blocks.begin() + skip, blocks.end());
    std::vector<int32_t> dst(rank.block_ids().begin(), rank.block_ids().end());
    ASSIGN_OR_RETURN(uint32_t crc,
                     kv_sender_->Send(target, src, dst, deadline, i * target.shape.num_kv_heads));
    commit.add_rank_crc32c(crc);
  }
  commit.set_request_id(r.id);
  *commit.mutable_prompt_token_ids() = req.prompt_token_ids();
  commit.set_first_token_id(static_cast<uint32_t>(r.last_token));
  commit.set_seed(r.engine_request.sampling.seed);
  commit.set_mrope_position_delta(prompt.mrope_position_delta);
  v1::KvCommitAck ack;
  grpc::ClientContext ctx;
  ctx.set_deadline(grpc_deadline);
  RETURN_IF_ERROR(FromGrpcStatus(stub->CommitKv(&ctx, commit, &ack)));
  if (!ack.accepted()) return absl::AbortedError(absl::StrCat("KvCommit refused: ", ack.error()));
  return absl::OkStatus();
}

}  // namespace mmserve::language
