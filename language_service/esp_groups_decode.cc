// EspGroups::Step: the master's decode of spread KV, one request at a time
// (esp_groups.h).
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
  if (local / bs >= static_cast<int64_t>(d.blocks.size())) {
    return absl::InternalError("the master's span is full");
  }
  const int64_t position = index + r.positions().delta;
  model::ForwardBatch b;
  b.token_ids = {d.last_token};
  b.positions = {position, position, position};
  b.slot_mapping = {d.blocks[local / bs] * bs + local % bs};
  b.sequences = {{0, 1, local + 1, d.blocks}};
  b.logits_rows = {0};
  std::vector<float> logits;
  RETURN_IF_ERROR(engine_.model().ForwardEspDecode(b, engine_.kv_cache(), client, &logits));
  const model::SampleResult s = d.request->Sample(absl::MakeSpan(logits));
  ASSIGN_OR_RETURN(*event, d.request->Push(s));
  d.last_token = s.token;
  return absl::OkStatus();
}

void EspGroups::Step(const Emit& emit) {
  std::vector<std::string> ids;
  for (const auto& [id, d] : decodes_) ids.push_back(id);
  for (const std::string& id : ids) {
    auto it = decodes_.find(id);
    if (it == decodes_.end()) continue;
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

}  // namespace mmserve::language
