#include "language_service/elastic_role.h"

#include <utility>

#include "common/status_macros.h"

namespace mmserve::language {

absl::Status ElasticRole::Attach(RoleHost& host) {
  host_ = &host;
  ASSIGN_OR_RETURN(
      groups_, ElasticGroups::Create(
                   options_, host.engine(), metrics_,
                   [this](const worker::StreamEvent& e) { host_->OnEvent(e); },
                   [this](const std::string& id, const worker::ElasticRequest::MasterState& state) {
                     OnMasterMoved(id, state);
                   }));
  return absl::OkStatus();
}

absl::Status ElasticRole::CheckPrefill(const v1::PrefillRequest& request) const {
  if (!request.decode().instance_id().empty()) {
    return absl::InvalidArgumentError("role elastic hands no KV to a decode instance");
  }
  return absl::OkStatus();
}

absl::Status ElasticRole::ElasticPrefill(const v1::ElasticPrefillRequest& request,
                                         RequestSink sink) {
  if (request.member() >= static_cast<uint32_t>(request.plan().members_size())) {
    return absl::InvalidArgumentError("the receiver is not a member of the plan");
  }
  absl::StatusOr<std::unique_ptr<LiveRequest>> r =
      host_->MakeRequest(request.request(), std::move(sink));
  absl::Status s = r.status();
  if (r.ok()) {
    (*r)->elastic_plan = std::make_unique<v1::ElasticPlan>(request.plan());
    (*r)->elastic_member = static_cast<int>(request.member());
    s = host_->Install(*std::move(r));
  }
  // A request of that id lives here already (this very group's, perhaps):
  // its group is left alone.
  if (!s.ok() && !absl::IsAlreadyExists(s)) {
    host_->RunOnLoop([this, plan = request.plan(), member = static_cast<int>(request.member()),
                      id = request.request().request_id(), s](bool shutting_down) {
      if (!shutting_down) groups_->Refuse(plan, member, id, s);
    });
  }
  return s;
}

absl::Status ElasticRole::ElasticMoveMaster(const v1::ElasticMoveRequest& request) {
  return host_->Call<absl::Status>([this, &request] { return MoveMasterHere(request); });
}

absl::StatusOr<std::vector<int32_t>> ElasticRole::HoldSpan(const std::string& id, int tokens) {
  if (id.empty()) return absl::InvalidArgumentError("request_id is empty");
  return host_->Call<absl::StatusOr<std::vector<int32_t>>>(
      [this, &id, tokens] { return HoldSpanHere(id, tokens); });
}

absl::Status ElasticRole::MoveMasterHere(const v1::ElasticMoveRequest& request) {
  const std::string& id = request.request_id();
  LiveRequest* r = host_->Find(id);
  if (r == nullptr || r->elastic_plan == nullptr) {
    return absl::NotFoundError("no request of that id waits to master here");
  }
  const v1::ElasticMasterState& m = request.state();
  worker::ElasticRequest::MasterState state{
      .generated =
          std::vector<int32_t>(m.generated_token_ids().begin(), m.generated_token_ids().end()),
      .seed = m.seed(),
      .draws = m.sampler_draws(),
      .mrope_delta = m.mrope_position_delta()};
  absl::Status s = groups_->Resume(id, state);
  if (!s.ok() && !absl::IsNotFound(s)) host_->End(id, s);
  return s;
}

void ElasticRole::OnMasterMoved(const std::string& id,
                                const worker::ElasticRequest::MasterState& state) {
  LiveRequest* r = host_->Find(id);
  if (r == nullptr) return;
  v1::TokenBatch b;
  b.set_request_id(id);
  v1::ElasticMasterState* m = b.mutable_elastic_moved();
  for (int32_t t : state.generated) m->add_generated_token_ids(static_cast<uint32_t>(t));
  m->set_seed(state.seed);
  m->set_sampler_draws(state.draws);
  m->set_mrope_position_delta(state.mrope_delta);
  r->sink.on_batch(std::move(b));
  host_->End(id, absl::OkStatus());  // its span stays held
}

absl::StatusOr<std::vector<int32_t>> ElasticRole::HoldSpanHere(const std::string& id, int tokens) {
  if (host_->Find(id) != nullptr)
    return absl::AlreadyExistsError("a request of that id lives here");
  ASSIGN_OR_RETURN(std::vector<kvpool::BlockId> blocks, host_->engine().HoldSpan(id, tokens));
  std::vector<int32_t> ids;
  ids.reserve(blocks.size());
  for (kvpool::BlockId b : blocks) ids.push_back(b.value);
  return ids;
}

bool ElasticRole::Admit(LiveRequest& r) {
  if (r.elastic_plan == nullptr) return false;  // a request alone: the engine's batch
  const std::string id = r.id;
  absl::StatusOr<std::unique_ptr<worker::ElasticRequest>> prepared =
      host_->engine().PrepareElastic(std::move(r.engine_request));
  if (!prepared.ok()) {
    groups_->Refuse(*r.elastic_plan, r.elastic_member, id, prepared.status());
    host_->End(id, prepared.status());
    return true;
  }
  Advance(r, RequestEvent::kImagesArrived);
  r.admitted_at_s = r.since_submit.ElapsedSeconds();
  // Blocks the loop for the group's prefill.
  absl::StatusOr<ElasticGroups::Prefilled> p = groups_->Prefill(
      *r.elastic_plan, r.elastic_member, *std::move(prepared), [this] { host_->UpdateLoad(); });
  if (!p.ok()) {
    host_->End(id, p.status());
    return true;
  }
  if (p->event.has_value()) host_->OnEvent(*p->event);                   // may end the request
  if (!p->decodes && !p->awaits_move) host_->End(id, absl::OkStatus());  // no-op when it ended
  return true;
}

void ElasticRole::Release(const std::string& id, const absl::Status& status) {
  if (!status.ok()) groups_->Release(id);
}

void ElasticRole::AbortUnknown(const std::string& id) {
  // A held span has no request here.
  groups_->Release(id);
  if (host_->engine().num_held_spans() > 0) host_->engine().ReleaseSpan(id).IgnoreError();
}

bool ElasticRole::Step() {
  groups_->ExpireIdle();
  if (!groups_->has_decodes()) return false;
  groups_->Step();
  return groups_->has_decodes();
}

}  // namespace mmserve::language
