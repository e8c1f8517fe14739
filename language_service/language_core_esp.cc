// LanguageCore's calls of role elastic: spans of a request's KV
// held for a group prefill, a member's part of a group prefill (EspGroups)
// and the decode steps of the requests mastered here.
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/status_macros.h"
#include "language_service/language_core.h"
#include "language_service/language_core_request.h"

namespace mmserve::language {

absl::StatusOr<std::vector<int32_t>> LanguageCore::HoldSpan(const std::string& id, int tokens) {
  if (role_->kind() != LanguageRole::kElastic) {
    return absl::FailedPreconditionError("only role elastic holds spans of group prefills");
  }
  if (id.empty()) return absl::InvalidArgumentError("request_id is empty");
  using Answer = absl::StatusOr<std::vector<int32_t>>;
  return loop_->Call<Answer>([&id, tokens](Reply<Answer> reply) {
    return Message{Message::HoldSpan{id, tokens, std::move(reply)}};
  });
}

absl::Status LanguageCore::EspMoveMaster(const v1::EspMoveRequest& request) {
  if (esp_ == nullptr) return absl::UnimplementedError("only role elastic masters ESP requests");
  return loop_->Call<absl::Status>([&request](Reply<absl::Status> reply) {
    return Message{Message::EspMove{&request, std::move(reply)}};
  });
}

void LanguageCore::HandleEsp(Message& message) {
  const absl::Status down = absl::UnavailableError("the language instance is shutting down");
  if (auto* hold = std::get_if<Message::HoldSpan>(&message.body)) {
    hold->reply.Send(shut_down_ ? down : HoldSpanHere(hold->id, hold->tokens));
  } else if (auto* move = std::get_if<Message::EspMove>(&message.body)) {
    move->reply.Send(shut_down_ ? down : MoveMasterHere(*move->request));
  }
}

absl::Status LanguageCore::MoveMasterHere(const v1::EspMoveRequest& request) {
  const std::string& id = request.request_id();
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->esp_plan == nullptr) {
    return absl::NotFoundError("no request of that id waits to master here");
  }
  const v1::EspMasterState& m = request.state();
  worker::EspRequest::MasterState state{
      .generated =
          std::vector<int32_t>(m.generated_token_ids().begin(), m.generated_token_ids().end()),
      .seed = m.seed(),
      .draws = m.sampler_draws(),
      .mrope_delta = m.mrope_position_delta()};
  absl::Status s = esp_->Resume(id, state);
  if (!s.ok() && !absl::IsNotFound(s)) End(id, s);
  return s;
}

void LanguageCore::OnMasterMoved(const std::string& id,
                                 const worker::EspRequest::MasterState& state) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  v1::TokenBatch b;
  b.set_request_id(id);
  v1::EspMasterState* m = b.mutable_esp_moved();
  for (int32_t t : state.generated) m->add_generated_token_ids(static_cast<uint32_t>(t));
  m->set_seed(state.seed);
  m->set_sampler_draws(state.draws);
  m->set_mrope_position_delta(state.mrope_delta);
  it->second->sink.on_batch(std::move(b));
  End(id, absl::OkStatus());  // its span stays held
}

absl::StatusOr<std::vector<int32_t>> LanguageCore::HoldSpanHere(const std::string& id, int tokens) {
  if (requests_.count(id) != 0) {
    return absl::AlreadyExistsError("a request of that id lives here");
  }
  ASSIGN_OR_RETURN(std::vector<kvpool::BlockId> blocks, engine_->HoldSpan(id, tokens));
  std::vector<int32_t> ids;
  ids.reserve(blocks.size());
  for (kvpool::BlockId b : blocks) ids.push_back(b.value);
  return ids;
}

absl::Status LanguageCore::EspPrefill(const v1::EspPrefillRequest& request, RequestSink sink) {
  if (esp_ == nullptr) {
    return absl::UnimplementedError("only role elastic joins elastic prefill groups");
  }
  if (request.member() >= static_cast<uint32_t>(request.plan().members_size())) {
    return absl::InvalidArgumentError("the receiver is not a member of the plan");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Request> r, MakeRequest(request.request(), std::move(sink)));
  r->esp_plan = std::make_unique<v1::EspPlan>(request.plan());
  r->esp_member = static_cast<int>(request.member());
  return Install(std::move(r));
}

size_t LanguageCore::num_esp_spans() const { return esp_ == nullptr ? 0 : esp_->num_held_spans(); }

void LanguageCore::AdmitEsp(Request& r) {
  const std::string id = r.id;
  absl::StatusOr<std::unique_ptr<worker::EspRequest>> prepared =
      engine_->PrepareEsp(std::move(r.engine_request));
  if (!prepared.ok()) {
    End(id, prepared.status());
    return;
  }
  Advance(r, RequestEvent::kImagesArrived);
  r.admitted_at_s = r.since_submit.ElapsedSeconds();
  // Blocks the loop for the group's prefill.
  absl::StatusOr<EspGroups::Prefilled> p =
      esp_->Prefill(*r.esp_plan, r.esp_member, *std::move(prepared), [this] { UpdateLoad(); });
  if (!p.ok()) {
    End(id, p.status());
    return;
  }
  if (p->event.has_value()) OnEvent(*p->event);                   // may end the request
  if (!p->decodes && !p->awaits_move) End(id, absl::OkStatus());  // no-op when it ended
}

bool LanguageCore::StepEsp() {
  if (esp_ == nullptr) return false;
  esp_->ExpireIdle();
  if (!esp_->has_decodes()) return false;
  esp_->Step();
  return esp_->has_decodes();
}

}  // namespace mmserve::language
