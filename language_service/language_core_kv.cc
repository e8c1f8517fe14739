// LanguageCore's calls of role decode (the Decode stream, AllocateKv,
// CommitKv) and role prefill's hand-off; the roles' own work is in
// decode_role.cc and prefill_role.cc.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "language_service/language_core.h"
#include "language_service/language_core_request.h"
#include "model/sampling_proto.h"

namespace mmserve::language {

void LanguageCore::RegisterHandOffMetrics(metrics::Registry& metrics) {
  kv_handoff_round_trips_ = &metrics.GetHistogram(
      "mmserve_language_kv_handoff_round_trips",
      "Per KV hand-off (role prefill), the round trips it waited for before the first token "
      "went out: AllocateKv, a landed reply or flush per decode rank whose cache is not mapped "
      "here, CommitKv.",
      {1, 2, 3, 4, 5, 6, 8, 16});
  for (transfer::KvHandoffPath path :
       {transfer::KvHandoffPath::kMapped, transfer::KvHandoffPath::kRendezvous,
        transfer::KvHandoffPath::kPut}) {
    kv_handoffs_[static_cast<int>(path)] = &metrics.GetCounter(
        "mmserve_language_kv_handoff_total",
        "KV written to decode ranks (role prefill; one per rank of each hand-off), by path: mapped "
        "(copied into the rank's shared segment, mapped here: shm), rendezvous (active messages "
        "into its private cache: tcp, or shm across IPC namespaces), put (a head slice put token "
        "by token).",
        {{"path", transfer::KvHandoffPathName(path)}});
  }
}

void LanguageCore::OnHandedOff(Request& r, const worker::StreamEvent& e, v1::TokenBatch b) {
  Advance(r, RequestEvent::kPromptDone);
  absl::StatusOr<HandOffResult> done =
      role_->HandOff({.request_id = r.id,
                      .decode = r.decode,
                      .max_tokens = r.engine_request.sampling.max_tokens,
                      .seed = r.engine_request.sampling.seed,
                      .first_token = r.last_token,
                      .kv_blocks = &e.kv_blocks,
                      .prompt = &e.handoff});
  if (!done.ok()) {
    End(r.id, done.status());
    return;
  }
  kv_handoff_round_trips_->Observe(done->round_trips);
  for (transfer::KvHandoffPath path : done->paths) {
    kv_handoffs_[static_cast<int>(path)]->Increment();
  }
  b.set_kv_handed_off(true);
  mmserve::v1::RequestTiming* t = b.mutable_timing();
  t->set_queue_ms(std::max(0.0, r.admitted_at_s * 1e3));
  t->set_prefill_ms(std::max(0.0, (r.first_token_at_s - r.admitted_at_s) * 1e3));
  r.sink.on_batch(std::move(b));
  End(r.id, absl::OkStatus());
}

absl::Status LanguageCore::RegisterDecode(const v1::DecodeRequest& request, RequestSink sink) {
  RETURN_IF_ERROR(role_->CheckDecodeCall());
  if (request.request_id().empty()) return absl::InvalidArgumentError("request_id is empty");
  auto r = std::make_unique<Request>();
  r->id = request.request_id();
  r->phase = RequestPhase::kRegistered;
  r->sink = std::move(sink);
  r->engine_request.id = r->id;
  ASSIGN_OR_RETURN(
      r->engine_request.sampling,
      model::SamplingFromProto(request.sampling(), config(), engine_->sizing().max_model_len,
                               &r->engine_request.max_tokens_to_context));
  r->include_usage = !request.stream().has_include_usage() || request.stream().include_usage();
  return Install(std::move(r));  // OnInstall: an empty first batch
}

absl::StatusOr<v1::KvAllocation> LanguageCore::AllocateKv(const v1::KvAllocateRequest& request) {
  RETURN_IF_ERROR(role_->CheckDecodeCall());
  if (request.prompt_token_ids_size() == 0) {
    return absl::InvalidArgumentError("AllocateKv needs the prompt's token ids");
  }
  using Answer = absl::StatusOr<v1::KvAllocation>;
  return loop_->Call<Answer>([&request](Reply<Answer> reply) {
    return Message{Message::AllocateKv{&request, std::move(reply)}};
  });
}

absl::StatusOr<v1::KvAllocation> LanguageCore::ReserveKv(const v1::KvAllocateRequest& request) {
  auto it = requests_.find(request.request_id());
  if (it == requests_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", request.request_id(), " has no open Decode call here"));
  }
  Request& r = *it->second;
  if (r.phase != RequestPhase::kRegistered) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", r.id, " already has its KV allocated"));
  }
  worker::EngineRequest er = r.engine_request;
  er.prompt_token_ids.assign(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
  er.sampling.seed = request.seed();
  ASSIGN_OR_RETURN(er.handoff_images, HandoffImagesFromProto(request));
  uint32_t image_tokens = 0;
  for (const worker::HandoffImage& h : er.handoff_images) {
    image_tokens += static_cast<uint32_t>(h.grid.num_tokens());
  }
  r.engine_request.sampling.seed = request.seed();
  worker::RemoteKvBlocks blocks;  // the commit deadline is the engine's DecodeKvConnector's
  RETURN_IF_ERROR(engine_->AddRequest(
      std::move(er), [this](const worker::StreamEvent& e) { OnEvent(e); }, &blocks));
  Advance(r, RequestEvent::kKvReserved);
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
  return role_->Allocation(request, blocks);
}

absl::Status LanguageCore::CommitKv(const v1::KvCommit& commit) {
  RETURN_IF_ERROR(role_->CheckDecodeCall());
  return loop_->Call<absl::Status>([&commit](Reply<absl::Status> reply) {
    return Message{Message::CommitKv{&commit, std::move(reply)}};
  });
}

absl::Status LanguageCore::CommitReservedKv(const v1::KvCommit& commit) {
  auto it = requests_.find(commit.request_id());
  if (it == requests_.end() || !InEngine(it->second->phase)) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", commit.request_id(), " has no KV allocated here"));
  }
  Request& r = *it->second;
  if (r.phase != RequestPhase::kAwaitingKv) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", r.id, " has no KV commit pending"));
  }
  if (commit.mrope_position_delta() != r.mrope_position_delta) {
    const absl::Status why = absl::InvalidArgumentError(
        absl::StrCat("request ", r.id, ": committed M-RoPE delta ", commit.mrope_position_delta(),
                     " != allocated ", r.mrope_position_delta));
    End(r.id, why);
    return why;
  }
  if (absl::Status s = role_->CheckCommit(commit, r.kv_blocks); !s.ok()) {
    // A commit of the wrong shape leaves the reservation to a right one.
    if (!absl::IsInvalidArgument(s)) End(r.id, s);
    return s;
  }
  const std::string id = r.id;
  RETURN_IF_ERROR(engine_->CommitRemoteKv(id, static_cast<int32_t>(commit.first_token_id())));
  // The first token may have ended the request already (its final event
  // came from CommitRemoteKv).
  auto held = requests_.find(id);
  if (held != requests_.end()) Advance(*held->second, RequestEvent::kKvCommitted);
  return absl::OkStatus();
}

}  // namespace mmserve::language
