// LlmEngine::Step: the connector's expired reservations, Schedule, the
// forward and sampling (ModelRunner), the scheduler's update, one event per
// sampled token, and the aborts of preempted requests the connector cannot
// recompute.
#include <string>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "worker/engine.h"
#include "worker/engine_live.h"

namespace mmserve::worker {
namespace {

// The prompt-only requests whose last prompt rows `out`'s forward computes
// go into `ending` with their blocks, and the runner reports each layer of
// that forward to the connector (KvConnector::OnLayersWritten).
template <typename LiveById>
void HookLayers(const scheduler::SchedulerOutput& out, const kvpool::KvCacheManager& kv,
                const LiveById& live_by_id, int num_layers, KvConnector& connector,
                ModelRunner& runner, std::vector<KvLayersWritten::Prompt>& ending) {
  for (const scheduler::ScheduledRequest& e : out.scheduled) {
    auto it = live_by_id.find(e.request->id().value);
    if (!e.samples || it == live_by_id.end() || !it->second->plan.prompt_only) continue;
    KvLayersWritten::Prompt& p = ending.emplace_back();
    p.id = it->second->id;
    for (kvpool::BlockId b : kv.block_table(e.request->block_table())) p.blocks.push_back(b.value);
  }
  if (ending.empty()) return;
  runner.set_layer_hook([&connector, &ending, num_layers](int layers) {
    connector.OnLayersWritten(
        {.prompts = &ending, .layers_written = layers, .num_layers = num_layers});
  });
}

}  // namespace

absl::Status LlmEngine::Step() {
  if (connector_ != nullptr) {
    for (const std::string& id : connector_->TakeExpired()) RETURN_IF_ERROR(Abort(id));
  }
  const scheduler::SchedulerOutput& out = scheduler_->Schedule();
  std::vector<std::pair<std::string, absl::Status>> victims;
  if (connector_ != nullptr) {
    for (scheduler::RequestId id : out.preempted) {
      auto it = by_scheduler_id_.find(id.value);
      if (it == by_scheduler_id_.end()) continue;
      absl::Status keep = connector_->OnPreempted(it->second->id);
      if (!keep.ok()) victims.emplace_back(it->second->id, std::move(keep));
    }
  }
  RETURN_IF_ERROR(StepScheduled(out));
  return AbortUnrecomputable(victims);
}

absl::Status LlmEngine::StepScheduled(const scheduler::SchedulerOutput& out) {
  if (out.scheduled.empty()) return scheduler_->UpdateFromOutput({}, nullptr);
  auto lookup = [this](scheduler::RequestId id) -> RunnerRequestState* {
    auto it = by_scheduler_id_.find(id.value);
    return it == by_scheduler_id_.end() ? nullptr : &it->second->runner;
  };
  absl::Status spread;
  model::SpanAttentionPeers* peers = PeersFor(out, &spread);
  std::vector<KvLayersWritten::Prompt> ending;  // outlives the forward that reports on them
  if (connector_ != nullptr && connector_->WantsLayers()) {
    HookLayers(out, scheduler_->kv_cache(), by_scheduler_id_,
               static_cast<int>(m_->config.text.num_hidden_layers), *connector_, *runner_, ending);
  }
  ASSIGN_OR_RETURN(std::vector<model::SampleResult> results,
                   runner_->Step(out, scheduler_->kv_cache(), lookup, peers, &spread));
  std::vector<scheduler::TokenId> tokens(out.scheduled.size(), kvpool::kNoToken);
  std::vector<Sampled> sampled;
  std::vector<Live*> failed;  // mastered here, their peers failed
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    if (!out.scheduled[i].samples) continue;
    const scheduler::Request& r = *out.scheduled[i].request;
    Live* live = by_scheduler_id_.at(r.id().value);
    if (results[i].token == kvpool::kNoToken) {
      failed.push_back(live);
      RETURN_IF_ERROR(scheduler_->Abort(live->sched_id));
      continue;
    }
    tokens[i] = results[i].token;
    Sampled s;
    s.live = live;
    if (!live->runner.sampling.greedy()) ++live->draws;  // model::Sample drew once
    s.result = results[i];
    if (r.num_output_tokens() == 0) s.live->cached_prompt_tokens = r.num_cached_tokens();
    // A prompt-only request's blocks, before UpdateFromOutput frees them.
    if (s.live->plan.prompt_only) {
      for (kvpool::BlockId b : scheduler_->kv_cache().block_table(r.block_table())) {
        s.blocks.push_back(b.value);
      }
    }
    sampled.push_back(std::move(s));
  }
  std::vector<std::unique_ptr<scheduler::Request>> finished;
  RETURN_IF_ERROR(scheduler_->UpdateFromOutput(tokens, &finished));
  absl::flat_hash_map<uint64_t, FinishReason> done;
  for (const auto& r : finished) done[r->id().value] = r->finish_reason();
  for (Sampled& s : sampled) {
    auto d = done.find(s.live->sched_id.value);
    if (d != done.end()) s.finished = d->second;
    RETURN_IF_ERROR(Emit(s));
  }
  for (Live* live : failed) {
    StreamEvent event;
    event.request_id = live->id;
    // What ended it, without the transport's details.
    event.error = absl::Status(spread.code(), "a member of the request's elastic group failed");
    if (absl::IsNotFound(spread) || absl::IsInternal(spread)) event.error = spread;
    Finish(*live, FinishReason::kAbort, event);
  }
  return absl::OkStatus();
}

model::SpanAttentionPeers* LlmEngine::PeersFor(const scheduler::SchedulerOutput& out,
                                               absl::Status* status) {
  std::vector<std::string> ids;
  for (const scheduler::ScheduledRequest& s : out.scheduled) {
    if (s.request->status() != scheduler::RequestStatus::kMastering) continue;
    ids.push_back(by_scheduler_id_.at(s.request->id().value)->id);
  }
  if (ids.empty()) return nullptr;
  if (master_peers_ == nullptr) {
    *status = absl::FailedPreconditionError("no span peers");
    return nullptr;
  }
  absl::StatusOr<model::SpanAttentionPeers*> peers = master_peers_->ForStep(ids);
  if (!peers.ok()) {
    *status = peers.status();
    return nullptr;
  }
  return *peers;
}

absl::StatusOr<FinishReason> TokenEvent(RunnerRequestState& runner, model::TextStreamer& streamer,
                                        const model::SampleResult& s, int completion,
                                        FinishReason finished, StreamEvent* event) {
  event->token_ids.push_back(s.token);
  if (runner.sampling.logprobs >= 0) event->logprobs.push_back(s);
  absl::StatusOr<bool> complete = AdvanceGrammar(runner, s.token);
  if (!complete.ok()) {
    event->error = complete.status();
    return FinishReason::kAbort;
  }
  ASSIGN_OR_RETURN(model::TextStreamer::Step text, streamer.Push(s.token, completion));
  event->text = std::move(text.text);
  if (text.stopped) {
    event->matched_stop = text.matched_stop;
    return FinishReason::kStopString;
  }
  // A complete constrained output ends as an end-of-sequence token would.
  if (*complete) return FinishReason::kStop;
  return finished;
}

absl::Status LlmEngine::Emit(Sampled& s) {
  Live& live = *s.live;
  StreamEvent event;
  event.request_id = live.id;
  ++live.completion_tokens;
  ASSIGN_OR_RETURN(const FinishReason why, TokenEvent(live.runner, *live.streamer, s.result,
                                                      live.completion_tokens, s.finished, &event));
  // The grammar or a stop string ended what the scheduler goes on with.
  if (why != s.finished && s.finished == FinishReason::kNone) {
    RETURN_IF_ERROR(scheduler_->Abort(live.sched_id));
  }
  if (why == FinishReason::kNone) {
    live.callback(event);
    return absl::OkStatus();
  }
  if (live.plan.prompt_only && why != FinishReason::kAbort && why != FinishReason::kStopString) {
    const KvPromptDone done{.id = live.id,
                            .first_token = s.result.token,
                            .reason = why,
                            .max_tokens = live.runner.sampling.max_tokens,
                            .blocks = &s.blocks,
                            .prompt = &live.handoff};
    if (connector_->OnPromptDone(done)) {
      event.kv_blocks = std::move(s.blocks);
      event.handoff = std::move(live.handoff);
      Finish(live, FinishReason::kHandoff, event);
      return absl::OkStatus();
    }
  }
  Finish(live, why, event);
  return absl::OkStatus();
}

absl::Status LlmEngine::AbortUnrecomputable(
    const std::vector<std::pair<std::string, absl::Status>>& victims) {
  for (const auto& [id, why] : victims) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    RETURN_IF_ERROR(scheduler_->Abort(it->second->sched_id));
    StreamEvent event;
    event.request_id = id;
    event.error = why;
    Finish(*it->second, FinishReason::kAbort, event);
  }
  return absl::OkStatus();
}

}  // namespace mmserve::worker
