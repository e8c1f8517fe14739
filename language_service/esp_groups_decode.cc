// EspGroups::Step: the master's decode of spread KV, one request at a time,
// and its moves to the next master (esp_groups.h).
#include <memory>
#include <utility>

#include "common/logging.h"
#include "common/status_macros.h"
#include "language_service/esp_groups.h"
#include "language_service/esp_groups_internal.h"

namespace mmserve::language {

absl::Status EspGroups::DecodeStep(Decode& d, worker::StreamEvent* event) {
  absl::SleepFor(options_.test_step_delay);
  transfer::UcxSpanPeers& client = esp_->span_client();
  if (client_request_ != d.id) {
    client_request_.clear();
    RETURN_IF_ERROR(client.Retarget(d.master, d.servers));
    client_request_ = d.id;
  }
  client.SetBatch(d.holders, d.self_holder, {d.tag});
  const worker::EspRequest& r = *d.request;
  // The last token is at index prompt + generated - 1 and sits at that
  // position plus the prompt's M-RoPE delta; its KV goes after the span.
  const int64_t index = r.prompt_len() + r.num_generated() - 1;
  const int64_t local = index - d.keep_begin;
  const int64_t bs = engine_.kv_cache().shape().block_size;
  if (index >= d.end || local / bs >= static_cast<int64_t>(d.blocks.size())) {
    return absl::InternalError("the master's span is full");
  }
  const int64_t position = index + r.positions().delta;
  model::ForwardBatch b;
  b.token_ids = {d.last_token};
  b.positions = {position, position, position};
  b.slot_mapping = {d.blocks[local / bs] * bs + local % bs};
  b.sequences = {{0, 1, local + 1, d.blocks}};
  b.logits_rows = {0};
  // A constrained request's next mask is computed while the forward runs.
  if (worker::RequestGrammar* g = r.grammar()) {
    if (masks_ == nullptr) masks_ = std::make_unique<worker::MaskWorker>();
    masks_->Start({g});
  }
  std::vector<float> logits;
  const absl::Status forward =
      engine_.model().ForwardEspDecode(b, engine_.kv_cache(), client, &logits);
  if (masks_ != nullptr) masks_->Wait();  // on every path: the grammar is the request's
  RETURN_IF_ERROR(forward);
  const model::SampleResult s = d.request->Sample(absl::MakeSpan(logits));
  ASSIGN_OR_RETURN(*event, d.request->Push(s));
  d.last_token = s.token;
  return absl::OkStatus();
}

void EspGroups::Step(const Emit& emit, const Moved& moved) {
  std::vector<std::string> ids;
  for (const auto& [id, d] : decodes_) ids.push_back(id);
  for (const std::string& id : ids) {
    auto it = decodes_.find(id);
    if (it == decodes_.end()) continue;
    const Decode& d = *it->second;
    if (!d.last && d.request->prompt_len() + d.request->num_generated() - 1 >= d.end) {
      MoveOn(id, moved);
      continue;
    }
    worker::StreamEvent event;
    absl::Status s = DecodeStep(*it->second, &event);
    if (!s.ok()) {
      LOG(WARNING) << "ESP decode of " << id << " failed: " << s;
      event = worker::StreamEvent();
      event.request_id = id;
      event.finish_reason = worker::FinishReason::kAbort;
      // What ended it, without the transport's details.
      event.error = absl::Status(s.code(), "a member of the request's ESP group failed");
      if (absl::IsNotFound(s) || absl::IsInternal(s)) event.error = s;
    }
    if (event.finish_reason != worker::FinishReason::kNone) Release(id);
    emit(event);
  }
}

// Its range is full: its KV stays here as an ordinary held span (the next
// master queries it like any other), its state goes to `moved`.
void EspGroups::MoveOn(const std::string& id, const Moved& moved) {
  auto it = decodes_.find(id);
  std::unique_ptr<Decode> d = std::move(it->second);
  decodes_.erase(it);
  if (client_request_ == id) client_request_.clear();
  const worker::EspRequest& r = *d->request;
  auto span = std::make_unique<Span>();
  span->id = id;
  span->blocks = std::move(d->blocks);
  span->keys = r.prompt_len() + r.num_generated() - 1 - d->keep_begin;
  span->masters = d->masters;
  span->last_query = absl::Now();
  const worker::EspRequest::MasterState state = r.ExportState();
  {
    absl::MutexLock lock(&mu_);
    spans_[d->tag] = std::move(span);
  }
  moves_->Increment();
  moved(id, state);
}

absl::Status EspGroups::Resume(const std::string& id,
                               const worker::EspRequest::MasterState& state) {
  auto it = waiting_.find(id);
  if (it == waiting_.end())
    return absl::NotFoundError("no request of that id waits to master here");
  Decode& d = *it->second;
  const int vocab = engine_.config().text.vocab_size;
  for (int32_t t : state.generated) {
    if (t < 0 || t >= vocab) return absl::InvalidArgumentError("a token outside the vocabulary");
  }
  // The last token's KV is the first this master writes: its range's begin.
  if (d.request->prompt_len() + static_cast<int64_t>(state.generated.size()) - 1 != d.first_index) {
    return absl::InvalidArgumentError("the master state does not continue this master's range");
  }
  RETURN_IF_ERROR(d.request->Resume(state));
  d.last_token = state.generated.back();
  decodes_[id] = std::move(it->second);
  waiting_.erase(it);
  return absl::OkStatus();
}

}  // namespace mmserve::language
