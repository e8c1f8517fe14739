// ElasticGroups' part in the master's decode: the span client for the engine's
// steps (MasterPeers), the engine's events of the requests mastered here,
// and their moves to the next master (elastic_groups.h).
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/status_macros.h"
#include "language_service/elastic_groups.h"
#include "language_service/elastic_groups_internal.h"

namespace mmserve::language {

absl::StatusOr<model::SpanAttentionPeers*> ElasticGroups::ForStep(
    absl::Span<const std::string> ids) {
  absl::SleepFor(options_.test_step_delay);
  const Decode* first = nullptr;
  std::vector<uint64_t> tags;
  for (const std::string& id : ids) {
    auto it = decodes_.find(id);
    if (it == decodes_.end()) return absl::InternalError("the request is not mastered here");
    if (first != nullptr && it->second->holder_set != first->holder_set) {
      return absl::InternalError("the step's requests have different span holders");
    }
    first = it->second.get();
    tags.push_back(first->tag);
  }
  if (first == nullptr) return absl::InternalError("no request to decode");
  transfer::UcxSpanPeers& client = elastic_->span_client();
  if (client_set_ != first->holder_set) {
    client_set_.reset();
    RETURN_IF_ERROR(client.Retarget(first->master, first->servers));
    client_set_ = first->holder_set;
  }
  client.SetBatch(first->holders, first->self_holder, std::move(tags));
  return &client;
}

worker::StreamCallback ElasticGroups::MasterCallback() {
  return [this](const worker::StreamEvent& e) {
    if (closing_) return;  // ~ElasticGroups ends them; nobody listens any more
    if (e.finish_reason != worker::FinishReason::kNone) {
      if (e.finish_reason == worker::FinishReason::kAbort && !e.error.ok()) {
        LOG(WARNING) << "elastic decode of " << e.request_id << " failed: " << e.error;
      }
      // The engine freed its span; the records here go.
      decodes_.erase(e.request_id);
      ForgetLanes(e.request_id);
    }
    emit_(e);
  };
}

// The KV index past its span's last slot.
int64_t ElasticGroups::SlotsEnd(const Decode& d) const {
  return d.keep_begin +
         static_cast<int64_t>(d.blocks.size()) * engine_.scheduler().kv_cache().block_size();
}

void ElasticGroups::Step() {
  std::vector<std::string> full;
  for (const auto& [id, d] : decodes_) {
    if (engine_.MasterSpanFull(id)) full.push_back(id);
  }
  for (const std::string& id : full) {
    Decode& d = *decodes_.at(id);
    if (SlotsEnd(d) < d.range_end) {
      Grow(d);
    } else if (!d.last) {
      MoveOn(id);
    }
  }
}

// Its span is full short of its range's end: it takes the next window
// past its last block's slots. With no block for it in the pool the
// engine ends the request RESOURCE_EXHAUSTED.
void ElasticGroups::Grow(Decode& d) {
  const int64_t end = std::min(d.range_end, SlotsEnd(d) + std::max<int64_t>(d.window, 1));
  const std::string id = d.id;  // `d` goes when its request ends
  absl::StatusOr<std::vector<kvpool::BlockId>> blocks = engine_.GrowMasterSpan(id, end);
  if (blocks.ok()) {
    d.reserved_end = end;
    d.blocks.clear();
    for (kvpool::BlockId b : *blocks) d.blocks.push_back(b.value);
    return;
  }
  // Its callback ended it when no slot was left (the records here are
  // gone then); else it decodes what it has and tries again when full.
  LOG(WARNING) << "elastic decode of " << id << " cannot grow: " << blocks.status();
}

// Its range is full: its KV stays here as an ordinary held span (the next
// master queries it like any other), its state goes to `moved_`.
void ElasticGroups::MoveOn(const std::string& id) {
  absl::StatusOr<worker::ElasticRequest::MasterState> state = engine_.StopMastering(id);
  if (!state.ok()) {
    LOG(WARNING) << "elastic master move of " << id << " failed: " << state.status();
    return;
  }
  auto it = decodes_.find(id);
  std::unique_ptr<Decode> d = std::move(it->second);
  decodes_.erase(it);
  auto span = std::make_unique<Span>();
  span->id = id;
  span->blocks = std::move(d->blocks);
  span->keys = d->prompt_len + static_cast<int64_t>(state->generated.size()) - 1 - d->keep_begin;
  span->masters = d->masters;
  span->last_query = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    spans_[d->tag] = std::move(span);
  }
  moves_->Increment();
  moved_(id, *state);
}

absl::Status ElasticGroups::Resume(const std::string& id,
                                   const worker::ElasticRequest::MasterState& state) {
  auto it = waiting_.find(id);
  if (it == waiting_.end()) {
    return absl::NotFoundError("no request of that id waits to master here");
  }
  Decode& d = *it->second;
  // The last token's KV is the first this master writes: its range's begin.
  if (d.prompt_len + static_cast<int64_t>(state.generated.size()) - 1 != d.first_index) {
    return absl::InvalidArgumentError("the master state does not continue this master's range");
  }
  RETURN_IF_ERROR(engine_.StartMastering(std::move(d.request), state,
                                         {.kv_begin = d.keep_begin, .decode_group = d.holder_set},
                                         MasterCallback()));
  decodes_[id] = std::move(it->second);
  waiting_.erase(it);
  client_set_.reset();  // its holders opened their lanes anew: reconnect
  return absl::OkStatus();
}

}  // namespace mmserve::language
