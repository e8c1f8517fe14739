#include "worker/engine.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/engine_live.h"
#include "worker/engine_media.h"

namespace mmserve::worker {

LlmEngine::~LlmEngine() = default;

absl::StatusOr<std::unique_ptr<LlmEngine>> LlmEngine::Create(
    const EngineOptions& options, std::unique_ptr<KvConnector> connector) {
  if (connector != nullptr) RETURN_IF_ERROR(connector->Attach({.tp_size = options.tp_size}));
  std::unique_ptr<LlmEngine> e(new LlmEngine());
  e->connector_ = std::move(connector);
  ASSIGN_OR_RETURN(e->m_, LoadEngineModel(options));
  const EngineModel& m = *e->m_;
  PromptRules& rules = e->rules_;
  rules.vocab_size = m.config.text.vocab_size;
  rules.hidden_size = m.config.text.hidden_size;
  rules.deepstack_levels = m.config.DeepstackLevels();
  rules.image_pad_id = m.image_pad_id;
  rules.video_pad_id = m.video_pad_id;
  rules.accepts_images = m.config.vision.has_value();
  rules.video_frames_apart =
      m.config.vision && m.config.vision->arch == model::VisionConfig::Arch::kQwen3Vl;
  rules.merge_size = m.config.vision ? m.config.vision->spatial_merge_size : 2;
  rules.max_model_len = m.sizing.max_model_len;
  rules.eos_ids = m.eos_ids;
  scheduler::SchedulerConfig sc;
  sc.max_num_batched_tokens = options.max_num_batched_tokens;
  sc.max_num_seqs = options.max_num_seqs;
  sc.max_prefill_tokens = options.max_prefill_tokens;
  sc.enable_chunked_prefill = options.enable_chunked_prefill;
  sc.priority_aging_steps = options.priority_aging_steps;
  sc.kv.num_blocks = m.sizing.num_kv_blocks;
  sc.kv.block_size = options.block_size;
  sc.kv.enable_prefix_caching = options.enable_prefix_caching;
  ASSIGN_OR_RETURN(e->scheduler_, scheduler::Scheduler::Create(sc));
  e->runner_ = std::make_unique<ModelRunner>(
      *m.model, *m.kv, m.tp_group != nullptr ? m.tp_group->ring() : nullptr,
      absl::Span<const uint8_t>(options.shared_input,
                                options.shared_input != nullptr ? options.shared_input_bytes : 0));
  e->media_ = std::make_unique<MediaAdmission>(*e->m_, e->rules_);
  return e;
}

absl::StatusOr<std::unique_ptr<LlmEngine::Live>> LlmEngine::Prepare(
    EngineRequest& request, StreamCallback callback, const KvPlan& plan,
    scheduler::RequestParams* params, const PromptRules& rules) {
  if (request.id.empty() || requests_.contains(request.id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request id \"", request.id, "\" is empty or already in use"));
  }
  RETURN_IF_ERROR(model::ValidateSamplingParams(request.sampling, rules.vocab_size));
  std::vector<int32_t> ids = request.prompt_token_ids;
  if (!request.prompt.empty()) {
    if (!ids.empty()) return absl::InvalidArgumentError("give a prompt or token ids, not both");
    ASSIGN_OR_RETURN(ids, m_->tokenizer->Encode(request.prompt));
  }
  RETURN_IF_ERROR(CheckTokenIds(ids, rules.vocab_size));
  auto live = std::make_unique<Live>();
  PreparedPrompt prompt;
  if (!request.handoff_images.empty()) {
    ASSIGN_OR_RETURN(prompt, PlaceHandoffImages(ids, request.handoff_images, rules));
  } else {
    ASSIGN_OR_RETURN(std::vector<MediaRows> rows, media_->RowsOf(request, live->image_embeddings));
    ASSIGN_OR_RETURN(prompt, ExpandImages(ids, rows, rules));
  }
  ASSIGN_OR_RETURN(const int max_tokens,
                   ResolveMaxTokens(request.sampling, request.max_tokens_to_context,
                                    prompt.token_ids.size(), rules));
  request.sampling.max_tokens = max_tokens;
  *params = SchedulerParams(scheduler::RequestId{next_id_++}, prompt, request.sampling, max_tokens,
                            rules);
  params->priority = request.priority;
  for (const PreparedMedia& image : prompt.images) {
    if (image.rows == nullptr) {  // handed off, or expected cached: its KV, not its rows
      live->cached_media_end = image.offset + image.length;
      continue;
    }
    live->runner.image_offsets.push_back(image.offset);
    live->runner.image_lengths.push_back(image.length);
    live->runner.image_embeddings.push_back(image.rows);
    live->runner.image_hashes.push_back(image.rank_hash);
  }
  live->runner.deepstack_levels = rules.deepstack_levels;
  live->plan = plan;
  if (plan.prompt_only) live->handoff = MakeHandoffPrompt(prompt);
  live->positions = std::move(prompt.positions);
  live->id = request.id;
  live->sched_id = params->id;
  live->callback = std::move(callback);
  live->sampler = model::SamplerState(request.sampling.seed);
  live->runner.sampling = request.sampling;
  live->runner.sampler = &live->sampler;
  live->runner.eos_token_ids = request.sampling.ignore_eos ? std::vector<int32_t>() : rules.eos_ids;
  live->streamer = std::make_unique<model::TextStreamer>(*m_->tokenizer, request.sampling);
  live->prompt_tokens = static_cast<int>(prompt.token_ids.size());
  live->runner.prompt_positions = &live->positions;
  if (request.sampling.constraint.has_value()) {
    ASSIGN_OR_RETURN(live->runner.grammar, CompileGrammar(*request.sampling.constraint));
  }
  return live;
}

absl::StatusOr<std::unique_ptr<RequestGrammar>> LlmEngine::CompileGrammar(
    const grammar::ConstraintSpec& spec) {
  if (grammars_ == nullptr) {
    grammars_ = std::make_unique<grammar::GrammarCache>(
        GrammarVocabulary(*m_->tokenizer, rules_.vocab_size, m_->eos_ids));
  }
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> compiled = grammars_->Get(spec);
  if (!compiled.ok()) {
    return model::ConstraintError(spec, absl::InvalidArgumentError(compiled.status().message()));
  }
  return std::make_unique<RequestGrammar>(*std::move(compiled), rules_.vocab_size);
}

absl::Status LlmEngine::AddRequest(EngineRequest request, StreamCallback callback,
                                   RemoteKvBlocks* remote_kv) {
  const KvRequestInfo info{request.id, static_cast<int>(request.handoff_images.size())};
  const KvPlan plan = connector_ != nullptr ? connector_->PlanRequest(info) : KvPlan{};
  if (plan.remote_prompt) {
    if (remote_kv == nullptr) {
      return absl::InvalidArgumentError("a remote prompt needs somewhere to return its blocks");
    }
    if (!request.images.empty() || !request.image_embeddings.empty()) {
      return absl::InvalidArgumentError("a KV hand-off carries image spans, not images");
    }
    if (!request.prompt.empty()) {
      return absl::InvalidArgumentError("a KV hand-off carries the prefill's token ids, not text");
    }
  } else if (!request.handoff_images.empty()) {
    return absl::InvalidArgumentError("hand-off images are for remote prompts only");
  }
  scheduler::RequestParams p;
  ASSIGN_OR_RETURN(std::unique_ptr<Live> live,
                   Prepare(request, std::move(callback), plan, &p, rules_));
  ASSIGN_OR_RETURN(
      live->completion_tokens,
      ReplayResumed(request.resume_output_token_ids, !plan.remote_prompt && !plan.prompt_only,
                    rules_.vocab_size, live->runner, *live->streamer, live->draws, p));
  if (plan.remote_prompt) return Reserve(std::move(live), std::move(p), info, remote_kv);
  if (plan.prompt_only) {
    p.max_tokens = 1;  // the decode engine produces the rest
    // Its blocks outlive its finish while a hand-off may read them (Finish).
    p.hold_kv_when_finished = true;
  }
  if (live->cached_media_end > 0) {
    ASSIGN_OR_RETURN(live->pin, scheduler_->PinCachedPrefix(p, live->cached_media_end));
  }
  if (absl::Status s = scheduler_->AddRequest(std::move(p)); !s.ok()) {
    if (live->pin) scheduler_->Unpin(*live->pin);
    return s;
  }
  if (plan.prompt_only) connector_->OnPromptQueued(live->id, live->handoff);
  by_scheduler_id_[live->sched_id.value] = live.get();
  requests_[live->id] = std::move(live);
  return absl::OkStatus();
}

absl::StatusOr<int> ReplayResumed(absl::Span<const int32_t> tokens, bool decoded_here,
                                  int vocab_size, RunnerRequestState& runner,
                                  model::TextStreamer& streamer, uint64_t& draws,
                                  scheduler::RequestParams& params) {
  if (tokens.empty()) return 0;
  if (!decoded_here) {
    return absl::InvalidArgumentError("a resumed request is decoded where it is prefilled");
  }
  if (tokens.size() >= static_cast<size_t>(params.max_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat("resume_output_token_ids: ", tokens.size(),
                                                   " tokens leave none below max_tokens ",
                                                   params.max_tokens));
  }
  RETURN_IF_ERROR(CheckTokenIds(tokens, vocab_size));
  // The scheduler's finish rules (eos, stop ids) over the tokens.
  scheduler::Request finish_rules(params, 0);
  for (size_t k = 0; k < tokens.size(); ++k) {
    const int32_t token = tokens[k];
    const bool ends = finish_rules.AppendOutputToken(token) != FinishReason::kNone;
    ASSIGN_OR_RETURN(const bool complete, AdvanceGrammar(runner, token));
    ASSIGN_OR_RETURN(const model::TextStreamer::Step text,
                     streamer.Push(token, static_cast<int>(k) + 1));
    if (ends || complete || text.stopped) {
      return absl::InvalidArgumentError(
          absl::StrCat("resume_output_token_ids: token ", k, " ends the request already"));
    }
    if (!runner.sampling.greedy()) {
      runner.sampler->Uniform();
      ++draws;
    }
  }
  params.resumed_output_token_ids.assign(tokens.begin(), tokens.end());
  return static_cast<int>(tokens.size());
}

absl::Status LlmEngine::Reserve(std::unique_ptr<Live> live, scheduler::RequestParams params,
                                const KvRequestInfo& info, RemoteKvBlocks* remote_kv) {
  ASSIGN_OR_RETURN(scheduler::Scheduler::RemoteKvReservation r,
                   scheduler_->ReserveRemoteKv(std::move(params)));
  *remote_kv = RemoteKvBlocks();
  remote_kv->num_cached_tokens = r.num_cached_tokens;
  live->cached_prompt_tokens = r.num_cached_tokens;
  remote_kv->mrope_position_delta = live->positions.delta;
  for (kvpool::BlockId b : r.blocks) remote_kv->blocks.push_back(b.value);
  connector_->OnReserved(live->id, info);
  by_scheduler_id_[live->sched_id.value] = live.get();
  requests_[live->id] = std::move(live);
  return absl::OkStatus();
}

void LlmEngine::Finish(Live& live, FinishReason reason, StreamEvent& event) {
  event.finish_reason = reason;
  // A hand-off leaves held-back text to the decode engine's streamer.
  if (reason != FinishReason::kStopString && reason != FinishReason::kHandoff) {
    event.text += live.streamer->Finish();
  }
  event.prompt_tokens = live.prompt_tokens;
  event.completion_tokens = live.completion_tokens;
  event.cached_prompt_tokens = live.cached_prompt_tokens;
  const std::string id = live.id;
  if (live.pin) scheduler_->Unpin(*live.pin);
  if (connector_ != nullptr) connector_->OnFinished(id);
  by_scheduler_id_.erase(live.sched_id.value);
  StreamCallback cb = std::move(live.callback);
  if (reason == FinishReason::kHandoff) {
    // Its blocks stay held (the scheduler's span of its id) until the
    // hand-off that reads them is over: ReleaseSpan or Abort.
    auto holder = std::make_unique<Live>();
    holder->id = id;
    holder->sched_id = live.sched_id;
    holder->holds_span = true;
    requests_[id] = std::move(holder);  // `live` is gone from here on
  } else {
    // A prompt-only request the scheduler finished keeps its blocks held
    // (hold_kv_when_finished) unless it is handed off: free them now.
    if (live.plan.prompt_only) scheduler_->ReleaseSpan(live.sched_id).IgnoreError();
    requests_.erase(id);  // `live` is gone from here on
  }
  cb(event);
}

absl::Status LlmEngine::Abort(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("no request \"", id, "\""));
  if (it->second->holds_span) return ReleaseSpan(id);
  RETURN_IF_ERROR(scheduler_->Abort(it->second->sched_id));
  StreamEvent event;
  event.request_id = id;
  Finish(*it->second, FinishReason::kAbort, event);
  return absl::OkStatus();
}

absl::Status LlmEngine::CommitRemoteKv(const std::string& id, int32_t first_token) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("no request \"", id, "\""));
  if (first_token < 0 || first_token >= rules_.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("first token ", first_token, " is outside the vocabulary"));
  }
  Live& live = *it->second;
  std::vector<std::unique_ptr<scheduler::Request>> finished;
  RETURN_IF_ERROR(scheduler_->CommitRemoteKv(live.sched_id, first_token, &finished));
  if (connector_ != nullptr) connector_->OnCommitted(id);
  // Continue the prefill's random stream (one draw per non-greedy sample)
  // and text stream (its text was streamed there).
  if (!live.runner.sampling.greedy()) {
    live.sampler.Uniform();
    ++live.draws;
  }
  live.completion_tokens = 1;
  StreamEvent event;
  event.request_id = id;
  // The grammar replays the token the prefill engine sampled under it.
  absl::StatusOr<bool> complete = AdvanceGrammar(live.runner, first_token);
  if (!complete.ok()) {
    if (finished.empty()) RETURN_IF_ERROR(scheduler_->Abort(live.sched_id));
    event.error = complete.status();
    Finish(live, FinishReason::kAbort, event);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(model::TextStreamer::Step text, live.streamer->Push(first_token, 1));
  if (text.stopped) {
    if (finished.empty()) RETURN_IF_ERROR(scheduler_->Abort(live.sched_id));
    event.matched_stop = text.matched_stop;
    Finish(live, FinishReason::kStopString, event);
  } else if (*complete) {
    if (finished.empty()) RETURN_IF_ERROR(scheduler_->Abort(live.sched_id));
    Finish(live, FinishReason::kStop, event);
  } else if (!finished.empty()) {
    Finish(live, finished[0]->finish_reason(), event);
  }
  return absl::OkStatus();
}

}  // namespace mmserve::worker
