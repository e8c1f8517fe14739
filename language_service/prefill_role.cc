#include "language_service/prefill_role.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "language_service/kv_bytes_moved.h"
#include "language_service/prompt_media.h"

namespace mmserve::language {

v1::KvAllocateRequest AllocateRequest(const HandOffRequest& r) {
  const std::vector<int32_t>& ids = r.prompt.token_ids;
  v1::KvAllocateRequest req;
  req.set_request_id(r.request_id);
  req.set_num_tokens(static_cast<uint32_t>(ids.size()));
  req.set_max_new_tokens(static_cast<uint32_t>(r.max_tokens));
  for (int32_t t : ids) req.add_prompt_token_ids(static_cast<uint32_t>(t));
  req.set_seed(r.seed);
  for (const worker::HandoffMedia& h : r.prompt.images) {
    v1::KvImageSpan* span = req.add_images();
    span->set_offset(static_cast<uint32_t>(h.offset));
    span->set_grid_t(static_cast<uint32_t>(h.grid.grid_t));
    span->set_grid_h(static_cast<uint32_t>(h.grid.grid_h));
    span->set_grid_w(static_cast<uint32_t>(h.grid.grid_w));
    span->set_kind(MediaKindToProto(h.grid.kind));
    if (h.grid.time_step != 1) span->set_time_step(static_cast<uint32_t>(h.grid.time_step));
    span->mutable_content_hash()->set_high(h.key.high);
    span->mutable_content_hash()->set_low(h.key.low);
  }
  req.set_mrope_position_delta(r.prompt.mrope_position_delta);
  return req;
}

namespace {

// Where decode rank `i` of `tp`, holding `heads` KV heads, wants its own.
absl::StatusOr<transfer::KvHandoffTarget> RankTarget(const v1::KvRankTarget& rank, int i, int tp,
                                                     int64_t heads) {
  if (rank.layout().tp_rank() != static_cast<uint32_t>(i) ||
      rank.layout().tp_size() != static_cast<uint32_t>(tp) ||
      rank.layout().num_kv_heads() != heads) {
    return absl::InternalError(absl::StrCat("the decode instance's rank ", i, " of ", tp, " holds ",
                                            rank.layout().num_kv_heads(), " KV heads as rank ",
                                            rank.layout().tp_rank(), " of ",
                                            rank.layout().tp_size(), "; its rank 0 ", heads));
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
  return target;
}

}  // namespace

absl::Status PrefillRole::AdjustEngineOptions(worker::EngineOptions& options) const {
  if (options.tp_size <= 1) return absl::OkStatus();
  ASSIGN_OR_RETURN(shard_kv_->files, worker::TpKvFiles::Create(options.tp_size));
  options.tp_shard_kv_fds = shard_kv_->files->fds();
  return absl::OkStatus();
}

absl::Status PrefillRole::Attach(RoleHost& host) {
  host_ = &host;
  engine_ = &host.engine();
  worker::LlmEngine& engine = *engine_;
  ASSIGN_OR_RETURN(kv_context_, transfer::UcxContext::Create(options_.kv_profile));
  std::vector<model::KvCache*> caches = {&engine.kv_cache()};
  tp_group_ = engine.tp_group();
  if (tp_group_ != nullptr) {
    // Mapped before the first forward (mapping zeroes a cache).
    const int tp = static_cast<int>(tp_group_->shard_pids().size()) + 1;
    if (shard_kv_->files == nullptr ||
        shard_kv_->files->fds().size() + 1 != static_cast<size_t>(tp)) {
      return absl::InternalError("role prefill: the shard ranks' KV caches are not in files");
    }
    for (int rank = 1; rank < tp; ++rank) {
      ASSIGN_OR_RETURN(std::unique_ptr<worker::TpKvView> view,
                       shard_kv_->files->Map(rank, engine.kv_cache().shape()));
      caches.push_back(&view->cache());
      shard_kv_->views.push_back(std::move(view));
    }
  }
  for (size_t rank = 0; rank < caches.size(); ++rank) {
    const transfer::UcxWorkerOptions wo{
        .name = rank == 0 ? instance_id_ + "-kv" : absl::StrCat(instance_id_, "-kv-rank", rank)};
    ASSIGN_OR_RETURN(std::unique_ptr<transfer::KvHandoffSender> sender,
                     transfer::KvHandoffSender::Create(*kv_context_, *caches[rank], wo));
    kv_senders_.push_back(std::move(sender));
    rank_caches_.push_back(caches[rank]);
  }
  handoff_threads_ = std::make_unique<WorkerPool>(
      WorkerPoolOptions{.name = "kv-handoff", .threads = kHandOffThreads});
  return absl::OkStatus();
}

absl::Status PrefillRole::RanksAlive() const {
  if (tp_group_ != nullptr && tp_group_->lost_rank()) {
    return absl::UnavailableError("a tensor-parallel rank of the prefill instance is gone");
  }
  return absl::OkStatus();
}

absl::Status PrefillRole::CheckPrefill(const v1::PrefillRequest& request) const {
  if (request.decode().address().empty()) {
    return absl::InvalidArgumentError("role prefill needs the decode instance (decode)");
  }
  return absl::OkStatus();
}

absl::Status PrefillRole::PreparePrefill(const v1::PrefillRequest& request,
                                         const model::Tokenizer& tokenizer,
                                         worker::EngineRequest& engine_request) const {
  if (engine_request.prompt_token_ids.empty()) {
    ASSIGN_OR_RETURN(engine_request.prompt_token_ids, tokenizer.Encode(engine_request.prompt));
  }
  engine_request.prompt.clear();
  return absl::OkStatus();
}

v1::Language::Stub& PrefillRole::DecodeStub(const std::string& address) {
  absl::MutexLock lock(&stubs_mu_);
  auto& stub = decode_stubs_[address];
  if (stub == nullptr) stub = v1::Language::NewStub(InternalChannel(address));
  return *stub;
}

absl::StatusOr<std::vector<PrefillRole::RankPut>> PrefillRole::RankPuts(
    const HandOffRequest& request, const v1::KvAllocation& alloc) {
  // Each pair of a rank here and a decode rank that share KV heads writes
  // those heads (transfer/kv_handoff_pairs.h).
  const int tp = alloc.ranks_size();
  if (tp < 1) return absl::InternalError("the decode instance answered no ranks");
  const int64_t decode_heads = alloc.ranks(0).layout().num_kv_heads();
  ASSIGN_OR_RETURN(const std::vector<transfer::KvRankPair> pairs,
                   transfer::PairKvRanks({.tp = static_cast<int>(rank_caches_.size()),
                                          .rank_heads = rank_caches_[0]->shape().num_kv_heads},
                                         {.tp = tp, .rank_heads = decode_heads}));
  // The decode side's block size (Send refuses one that differs from ours).
  const int64_t block_size = alloc.ranks(0).layout().block_size();
  const std::vector<int32_t>& blocks = request.kv_blocks;
  const size_t skip = alloc.num_cached_tokens() / std::max<int64_t>(1, block_size);
  std::vector<transfer::KvHandoffTarget> targets;
  for (int i = 0; i < tp; ++i) {
    const v1::KvRankTarget& rank = alloc.ranks(i);
    RETURN_IF_ERROR(
        transfer::CheckSameHost(options_.kv_profile, rank.peer().host(), "the decode instance"));
    ASSIGN_OR_RETURN(targets.emplace_back(), RankTarget(rank, i, tp, decode_heads));
    if (skip > blocks.size() ||
        blocks.size() - skip != static_cast<size_t>(rank.block_ids_size())) {
      return absl::InternalError(absl::StrCat("the decode instance allocated ",
                                              rank.block_ids_size(), " blocks after ", skip,
                                              " cached for a prompt of ", blocks.size()));
    }
  }
  std::vector<RankPut> puts;
  for (const transfer::KvRankPair& pair : pairs) {
    const v1::KvRankTarget& rank = alloc.ranks(pair.decode_rank);
    RankPut& put = puts.emplace_back();
    put.target = targets[pair.decode_rank];
    put.src.assign(blocks.begin() + skip, blocks.end());
    put.dst.assign(rank.block_ids().begin(), rank.block_ids().end());
    put.prefill_rank = pair.prefill_rank;
    put.decode_rank = pair.decode_rank;
    put.heads = pair.heads;
  }
  return puts;
}

absl::Status PrefillRole::SendPuts(const std::vector<RankPut>& puts, transfer::KvLayerRange layers,
                                   Deadline deadline, std::vector<uint32_t>& crcs,
                                   HandOffResult& result) {
  const int64_t num_layers = rank_caches_[0]->shape().num_layers;
  const int64_t count = layers.count == 0 ? num_layers - layers.first : layers.count;
  result.paths.resize(puts.size(), transfer::KvHandoffPath::kRendezvous);
  // Every write set moving before any is waited for: the pairs' bytes fly
  // together (each rank's sender its own progress and copy threads).
  absl::Status status;
  std::vector<std::unique_ptr<transfer::KvHandoffWrite>> writes(puts.size());
  for (size_t i = 0; i < puts.size() && status.ok(); ++i) {
    const RankPut& put = puts[i];
    absl::StatusOr<std::unique_ptr<transfer::KvHandoffWrite>> w =
        kv_senders_[put.prefill_rank]->Start(put.target, put.src, put.dst, deadline, layers,
                                             put.heads);
    if (w.ok()) {
      writes[i] = std::move(*w);
    } else {
      status = w.status();
    }
  }
  // Per decode rank: the writes into it, in its head order (RankPuts).
  std::map<int, std::vector<transfer::KvHeadSource>> sources;
  std::map<int, uint32_t> only;  // the CRC32C of a decode rank's one write
  bool waited = false;
  // Each started write is finished (its source blocks are read until
  // then), after a failed one too; the first error is the hand-off's.
  for (size_t i = 0; i < puts.size(); ++i) {
    if (writes[i] == nullptr) continue;
    const RankPut& put = puts[i];
    const transfer::KvHandoffPath path = writes[i]->path();
    absl::StatusOr<uint32_t> crc = writes[i]->Finish();
    if (!crc.ok()) {
      if (status.ok()) status = crc.status();
      continue;
    }
    sources[put.decode_rank].push_back({rank_caches_[put.prefill_rank], put.heads});
    only[put.decode_rank] = *crc;
    result.paths[i] = path;
    model::KvCacheShape moved = put.target.shape;
    moved.num_kv_heads = put.heads.count;
    bytes_.Sent(transfer::KvHandoffBytes(moved, put.src.size(), count));
    waited = waited || path != transfer::KvHandoffPath::kMapped;
  }
  RETURN_IF_ERROR(status);
  // AllocateKv and CommitKv come on top (Commit); one round trip for the
  // landed replies or flushes the writes wait for together, unless every
  // write copied into a mapped cache.
  if (waited) ++result.round_trips;
  crcs.assign(sources.size(), 0);
  for (const auto& [rank, from] : sources) {
    // Several ranks here wrote into this one: its CRC32C runs over their
    // heads interleaved token by token, as it holds them.
    crcs[rank] = from.size() == 1 ? only[rank] : transfer::KvGatheredCrc(from, puts[0].src, layers);
  }
  return absl::OkStatus();
}

absl::Status PrefillRole::PutToRanks(const HandOffRequest& request, const v1::KvAllocation& alloc,
                                     Deadline deadline, v1::KvCommit& commit,
                                     HandOffResult& result) {
  ASSIGN_OR_RETURN(const std::vector<RankPut> puts, RankPuts(request, alloc));
  std::vector<uint32_t> crcs;
  RETURN_IF_ERROR(SendPuts(puts, transfer::KvLayerRange{}, deadline, crcs, result));
  for (uint32_t crc : crcs) commit.add_rank_crc32c(crc);
  return absl::OkStatus();
}

absl::Status PrefillRole::Commit(const HandOffRequest& request, v1::KvCommit& commit,
                                 std::chrono::system_clock::time_point deadline,
                                 HandOffResult& result) {
  commit.set_request_id(request.request_id);
  for (int32_t t : request.prompt.token_ids) commit.add_prompt_token_ids(static_cast<uint32_t>(t));
  commit.set_first_token_id(static_cast<uint32_t>(request.first_token));
  commit.set_seed(request.seed);
  commit.set_mrope_position_delta(request.prompt.mrope_position_delta);
  v1::KvCommitAck ack;
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  RETURN_IF_ERROR(
      FromGrpcStatus(DecodeStub(request.decode.address()).CommitKv(&ctx, commit, &ack)));
  if (!ack.accepted()) return absl::AbortedError(absl::StrCat("KvCommit refused: ", ack.error()));
  result.round_trips += 2;  // AllocateKv, CommitKv
  return absl::OkStatus();
}

absl::StatusOr<HandOffResult> PrefillRole::HandOff(const HandOffRequest& request,
                                                   const std::atomic<bool>& cancelled) {
  if (cancelled) return absl::CancelledError("the request ended before its hand-off");
  const Deadline deadline = Deadline::After(options_.kv_handoff_timeout);
  const auto grpc_deadline =
      std::chrono::system_clock::now() + absl::ToChronoNanoseconds(options_.kv_handoff_timeout);
  v1::Language::Stub& stub = DecodeStub(request.decode.address());
  const v1::KvAllocateRequest req = AllocateRequest(request);
  v1::KvAllocation alloc;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(grpc_deadline);
    RETURN_IF_ERROR(FromGrpcStatus(stub.AllocateKv(&ctx, req, &alloc)));
  }
  if (options_.test_kv_handoff_delay > absl::ZeroDuration()) {
    LOG(WARNING) << "request " << request.request_id << ": test-only hand-off delay of "
                 << options_.test_kv_handoff_delay << " after AllocateKv";
    absl::SleepFor(options_.test_kv_handoff_delay);
  }
  v1::KvCommit commit;
  HandOffResult result;
  RETURN_IF_ERROR(RanksAlive());
  RETURN_IF_ERROR(PutToRanks(request, alloc, deadline, commit, result));
  // Its decode reservation is freed at its commit deadline (or when the
  // router cancels the decode stream).
  if (cancelled) return absl::CancelledError("the request ended during its hand-off");
  RETURN_IF_ERROR(RanksAlive());
  RETURN_IF_ERROR(Commit(request, commit, grpc_deadline, result));
  return result;
}

bool PrefillRole::TakeEvent(LiveRequest& r, const worker::StreamEvent& e, v1::TokenBatch& batch) {
  if (e.finish_reason != worker::FinishReason::kHandoff) return false;
  Advance(r, RequestEvent::kPromptDone);
  auto cancelled = std::make_shared<std::atomic<bool>>(false);
  batch.set_kv_handed_off(true);
  mmserve::v1::RequestTiming* t = batch.mutable_timing();
  t->set_queue_ms(std::max(0.0, r.admitted_at_s * 1e3));
  t->set_prefill_ms(std::max(0.0, (r.first_token_at_s - r.admitted_at_s) * 1e3));
  if (auto it = streams_.find(r.id); it != streams_.end()) {
    // Layer-wise: its groups are on their way; CommitKv may go now.
    std::shared_ptr<LayerStream> s = std::move(it->second);
    streams_.erase(it);
    handing_off_[r.id] = Pending{.cancelled = cancelled,
                                 .last = std::move(batch),
                                 .stream = s,
                                 .first_token_at = absl::Now()};
    if (!Committable(s, e.kv_blocks, r.last_token)) Finished(r.id, RoleHost::ShuttingDown());
    return true;
  }
  handing_off_[r.id] =
      Pending{.cancelled = cancelled, .last = std::move(batch), .first_token_at = absl::Now()};
  HandOffRequest request{.request_id = r.id,
                         .decode = r.decode,
                         .max_tokens = r.engine_request.sampling.max_tokens,
                         .seed = r.engine_request.sampling.seed,
                         .first_token = r.last_token,
                         .kv_blocks = e.kv_blocks,
                         .prompt = e.handoff};
  const bool posted = handoff_threads_->Post(
      [this, request = std::move(request), cancelled = std::move(cancelled)]() {
        absl::StatusOr<HandOffResult> done = HandOff(request, *cancelled);
        host_->RunOnLoop(
            [this, id = request.request_id, done = std::move(done)](bool) { Finished(id, done); });
      });
  if (!posted) Finished(r.id, RoleHost::ShuttingDown());
  return true;
}

void PrefillRole::Release(const std::string& id, const absl::Status& /*status*/) {
  auto it = handing_off_.find(id);
  if (it == handing_off_.end()) return;
  // The hand-off thread still reads the blocks: Finished frees them.
  it->second.cancelled->store(true);
  if (it->second.stream != nullptr) Cancel(*it->second.stream, /*await_reads=*/false);
  it->second.ended = true;
}

void PrefillRole::Finished(const std::string& id, const absl::StatusOr<HandOffResult>& done) {
  auto it = handing_off_.find(id);
  if (it == handing_off_.end()) return;
  Pending pending = std::move(it->second);
  handing_off_.erase(it);
  // Nothing reads the blocks any more (an abort that came meanwhile left
  // them held).
  engine_->ReleaseSpan(id).IgnoreError();
  if (pending.ended) return;
  if (!done.ok()) {
    host_->End(id, done.status());
    return;
  }
  LanguageMetrics& m = host_->metrics();
  m.kv_handoff_round_trips->Observe(done->round_trips);
  m.kv_handoff_layer_groups->Increment(done->layer_groups);
  m.kv_handoff_exposed_seconds->Observe(
      absl::ToDoubleSeconds(absl::Now() - pending.first_token_at));
  for (transfer::KvHandoffPath path : done->paths) {
    m.kv_handoffs[static_cast<int>(path)]->Increment();
  }
  if (LiveRequest* r = host_->Find(id)) r->sink.on_batch(std::move(pending.last));
  host_->End(id, absl::OkStatus());
}

}  // namespace mmserve::language
