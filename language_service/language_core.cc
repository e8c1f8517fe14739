#include "language_service/language_core.h"

#include <algorithm>
#include <type_traits>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "language_service/language_core_request.h"
#include "language_service/prompt_media.h"
#include "model/sampling_proto.h"

namespace mmserve::language {
namespace {

constexpr absl::Duration kIdleWait = absl::Milliseconds(50);

}  // namespace

mmserve::v1::FinishReason FinishReasonToProto(worker::FinishReason r) {
  switch (r) {
    case worker::FinishReason::kStop:
      return mmserve::v1::FINISH_REASON_STOP;
    case worker::FinishReason::kLength:
      return mmserve::v1::FINISH_REASON_LENGTH;
    case worker::FinishReason::kStopString:
      return mmserve::v1::FINISH_REASON_STOP_STRING;
    case worker::FinishReason::kAbort:
      return mmserve::v1::FINISH_REASON_ABORT;
    case worker::FinishReason::kNone:
    case worker::FinishReason::kHandoff:
      break;
  }
  return mmserve::v1::FINISH_REASON_UNSPECIFIED;
}

LanguageCore::LanguageCore(const LanguageCoreOptions& options, transfer::TransferEngine& transfer,
                           metrics::Registry& metrics)
    : options_(options), transfer_(transfer), metrics_(metrics) {}

absl::StatusOr<std::unique_ptr<LanguageCore>> LanguageCore::Create(
    const LanguageCoreOptions& options, transfer::TransferEngine& transfer,
    metrics::Registry& metrics) {
  std::unique_ptr<LanguageCore> core(new LanguageCore(options, transfer, metrics));
  ASSIGN_OR_RETURN(core->role_,
                   MakeRole(options.role, options.instance_id, metrics, options.elastic));
  worker::EngineOptions eo = options.engine;
  eo.load_vision = false;
  RETURN_IF_ERROR(core->role_->AdjustEngineOptions(eo));
  ASSIGN_OR_RETURN(core->engine_, worker::LlmEngine::Create(eo, core->role_->MakeConnector()));
  const transfer::EmbeddingLayout& layout = transfer.buffer().layout();
  if (core->config().vision &&
      (layout.hidden_size != static_cast<uint32_t>(core->config().EmbeddingRowWidth()) ||
       layout.dtype_bytes != sizeof(float))) {
    return absl::InvalidArgumentError(
        "embedding buffer rows do not match the model's hidden size and DeepStack features");
  }
  RETURN_IF_ERROR(core->role_->Attach(*core));
  const kvpool::KvCacheManager& kv = core->engine_->scheduler().kv_cache();
  core->prefixes_ = std::make_unique<PrefixDigest>(
      PrefixDigestOptions{.max_tokens = static_cast<uint64_t>(kv.num_blocks()) *
                                        static_cast<uint64_t>(kv.block_size())},
      static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
  core->UpdateLoad();
  LanguageCore* c = core.get();
  core->images_ = std::make_unique<MediaGather>(
      MediaGatherOptions{
          .name = options.instance_id,
          .mm_handoff = options.mm_handoff,
          .transfer_timeout = options.transfer_timeout,
          .lost_image_timeout = options.lost_image_timeout,
          .connect_timeout = options.connect_timeout,
          .spatial_merge_size = c->config().vision ? c->config().vision->spatial_merge_size : 2,
          .deepstack_levels = c->config().DeepstackLevels()},
      transfer, core->metrics_,
      MediaGather::Hooks{.post =
                             [c](absl::AnyInvocable<void()> task) {
                               return c->Post(
                                   {Message::Run{[t = std::move(task)](bool) mutable { t(); }}});
                             },
                         .find = [c](const std::string& id) { return c->requests_.Find(id); },
                         .on_ready = [c](LiveRequest& r) { c->Admit(r); }});
  core->loop_ = std::make_unique<MessageLoop<Message>>(
      [c](Message& m) { c->Handle(m); },
      EventLoopOptions{.name = options.instance_id + "-loop",
                       .step = [c](bool) { return c->StepHook(); },
                       .on_fatal = options.on_fatal});
  return core;
}

LanguageCore::~LanguageCore() { Shutdown(); }

bool LanguageCore::Post(Message message) { return loop_->Post(std::move(message)); }

void LanguageCore::Handle(Message& message) {
  std::visit(
      [this](auto& m) {
        using M = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<M, Message::Install>) {
          OnInstall(std::move(m.request));
        } else if constexpr (std::is_same_v<M, Message::Abort>) {
          OnAbort(m.id, m.reason);
        } else if constexpr (std::is_same_v<M, Message::Retry>) {
          if (LiveRequest* r = requests_.Find(m.retry.request_id())) {
            images_->ApplyRetry(*r, m.retry);
          }
        } else if constexpr (std::is_same_v<M, Message::Run>) {
          m.task(shut_down_);
        } else {
          static_assert(std::is_same_v<M, Message::ShutDown>);
          OnShutDown();
        }
      },
      message.body);
}

bool LanguageCore::RunOnLoop(absl::AnyInvocable<void(bool shutting_down)> task) {
  if (loop_->IsInLoopThread()) {
    task(shut_down_);
    return true;
  }
  return Post({Message::Run{std::move(task)}});
}

absl::Status LanguageCore::Submit(const v1::PrefillRequest& request, RequestSink sink) {
  ASSIGN_OR_RETURN(std::unique_ptr<LiveRequest> r, MakeRequest(request, std::move(sink)));
  return Install(std::move(r));
}

absl::StatusOr<std::unique_ptr<LiveRequest>> LanguageCore::MakeRequest(
    const v1::PrefillRequest& request, RequestSink sink) {
  if (request.request_id().empty()) return absl::InvalidArgumentError("request_id is empty");
  RETURN_IF_ERROR(role_->CheckPrefill(request));
  std::vector<model::MediaKind> slots;
  ASSIGN_OR_RETURN(model::ChatFamily family, model::ChatFamilyFor(config().model_type));
  ASSIGN_OR_RETURN(std::string prompt, RenderPrompt(request, family, &slots));
  RETURN_IF_ERROR(CheckPromptMedia(slots, request));
  ASSIGN_OR_RETURN(prompt, WithVideoTimestamps(std::move(prompt), request));
  if (request.images_size() > 0 && !config().vision) {
    return absl::InvalidArgumentError("this model does not accept images");
  }
  auto r = std::make_unique<LiveRequest>();
  r->id = request.request_id();
  r->sink = std::move(sink);
  r->engine_request.id = r->id;
  r->engine_request.priority = request.priority();
  r->engine_request.prompt = std::move(prompt);
  if (request.has_raw() && request.raw().token_ids_size() > 0) {
    if (!request.raw().text().empty()) {
      return absl::InvalidArgumentError("give raw text or token ids, not both");
    }
    r->engine_request.prompt_token_ids.assign(request.raw().token_ids().begin(),
                                              request.raw().token_ids().end());
  }
  ASSIGN_OR_RETURN(
      r->engine_request.sampling,
      model::SamplingFromProto(request.sampling(), config(), engine_->sizing().max_model_len,
                               &r->engine_request.max_tokens_to_context));
  r->engine_request.resume_output_token_ids.assign(request.resume_output_token_ids().begin(),
                                                   request.resume_output_token_ids().end());
  r->include_usage = !request.stream().has_include_usage() || request.stream().include_usage();
  r->prefix_key = RequestPrefixKey(request, &r->prefix_covered);
  r->prefills = true;
  RETURN_IF_ERROR(role_->PreparePrefill(request, engine_->tokenizer(), r->engine_request));
  r->decode = request.decode();
  for (const v1::PromptImage& image : request.images()) {
    RETURN_IF_ERROR(CheckImageSource(image, slots[r->images.size()]));
    LiveRequest::Image im;
    im.meta = image;
    im.embedding.grid.kind = slots[r->images.size()];  // the retries' meta may omit it
    r->images.push_back(std::move(im));
  }
  return r;
}

void LanguageCore::OnInstall(std::unique_ptr<LiveRequest> owned) {
  LiveRequest& rr = *owned;
  requests_.Insert(std::move(owned));
  if (rr.phase == RequestPhase::kRegistered) {
    // An empty first batch: the request is held here, AllocateKv may come.
    v1::TokenBatch registered;
    registered.set_request_id(rr.id);
    rr.sink.on_batch(std::move(registered));
    return;
  }
  images_->Start(rr);  // Admit once every image is here
}

bool LanguageCore::Retry(const v1::ImageRetry& retry) {
  // The retry may overtake the Prefill call it belongs to (separate RPCs):
  // kept for a while, and applied when the request is installed.
  if (!requests_.RunUnlessKnown(retry.request_id(), [&] { images_->KeepEarly(retry); })) {
    Post({Message::Retry{retry}});
  }
  return true;
}

void LanguageCore::Admit(LiveRequest& r) {
  if (role_->Admit(r)) return;
  const std::string id = r.id;
  const auto expected = std::count_if(r.images.begin(), r.images.end(), [](const auto& im) {
    return im.meta.expect_cached() && im.state == LiveRequest::MediaState::kArrived;
  });
  const bool expects_cached = expected > 0;
  // With images expected cached the request keeps its own: if their KV is
  // gone, it waits for them from an encoder with the others' rows.
  worker::EngineRequest request = expects_cached ? r.engine_request : std::move(r.engine_request);
  absl::Status s =
      engine_->AddRequest(std::move(request), [this](const worker::StreamEvent& e) { OnEvent(e); });
  if (expects_cached && absl::IsFailedPrecondition(s)) {
    metrics_.images_not_cached->Increment(images_->LoseCached(r, s));
    return;
  }
  if (expects_cached && s.ok()) metrics_.images_found_cached->Increment(expected);
  if (!s.ok()) {
    End(id, s);
    return;
  }
  Advance(r, RequestEvent::kImagesArrived);
  r.admitted_at_s = r.since_submit.ElapsedSeconds();
}

absl::Status LanguageCore::Install(std::unique_ptr<LiveRequest> r) {
  const std::string id = r->id;
  return requests_.Claim(id, [&] { return Post({Message::Install{std::move(r)}}); });
}

void LanguageCore::Abort(const std::string& request_id, const std::string& reason) {
  Post({Message::Abort{request_id, reason}});
}

void LanguageCore::OnAbort(const std::string& request_id, const std::string& reason) {
  LiveRequest* r = requests_.Find(request_id);
  if (r == nullptr) {
    role_->AbortUnknown(request_id);
    return;
  }
  if (!role_->Owns(*r) &&
      (r->phase == RequestPhase::kAwaitingKv || r->phase == RequestPhase::kInEngine)) {
    Advance(*r, RequestEvent::kAbortAsked);
    engine_->Abort(request_id).IgnoreError();  // its event ends the request
    return;
  }
  End(request_id, absl::CancelledError(reason));
}

// The tokens, text and log-probabilities of one engine event.
v1::TokenBatch LanguageCore::Batch(const LiveRequest& r, const worker::StreamEvent& e) const {
  v1::TokenBatch b;
  b.set_request_id(r.id);
  b.set_text(e.text);
  for (int32_t t : e.token_ids) b.add_token_ids(static_cast<uint32_t>(t));
  const model::Tokenizer& tok = engine_->tokenizer();
  for (const model::SampleResult& s : e.logprobs) {
    mmserve::v1::PositionLogprobs* pl = b.add_logprobs();
    pl->mutable_sampled()->set_token_id(static_cast<uint32_t>(s.token));
    pl->mutable_sampled()->set_logprob(s.logprob);
    pl->mutable_sampled()->set_text(tok.Decode({s.token}, false).value_or(""));
    for (const model::TokenLogprob& t : s.top) {
      mmserve::v1::TokenLogprob* tl = pl->add_top();
      tl->set_token_id(static_cast<uint32_t>(t.token));
      tl->set_logprob(t.logprob);
      tl->set_text(tok.Decode({t.token}, false).value_or(""));
    }
  }
  return b;
}

void LanguageCore::OnEvent(const worker::StreamEvent& e) {
  LiveRequest* found = requests_.Find(e.request_id);
  if (found == nullptr) return;
  LiveRequest& r = *found;
  if (r.phase == RequestPhase::kAborting) {
    End(r.id, absl::CancelledError("aborted"));
    return;
  }
  if (e.finish_reason == worker::FinishReason::kAbort) {
    // The engine ends a request on its own only on role decode: a
    // reservation whose commit deadline passed, or (e.error) one it cannot
    // keep.
    End(r.id, e.error.ok() ? absl::DeadlineExceededError(
                                 "the prefill instance did not commit the KV in time")
                           : e.error);
    return;
  }
  const double now = r.since_submit.ElapsedSeconds();
  if (!e.token_ids.empty()) {
    r.last_token = e.token_ids.back();
    if (r.last_token_at_s < 0) {
      r.first_token_at_s = now;
      metrics_.ttft_seconds->Observe(now);
    } else {
      metrics_.itl_seconds->Observe(now - r.last_token_at_s);
    }
    r.last_token_at_s = now;
  }
  if (e.finish_reason != worker::FinishReason::kNone && r.prefills && r.elastic_plan == nullptr &&
      e.prompt_tokens > 0) {
    const int cached = std::min(e.cached_prompt_tokens, e.prompt_tokens);
    metrics_.prompt_tokens_cached->Increment(cached);
    metrics_.prompt_tokens_computed->Increment(e.prompt_tokens - cached);
  }
  if (e.finish_reason != worker::FinishReason::kNone && r.prefix_key != 0 && e.prompt_tokens > 0) {
    // The prompt's KV is computed and cached: the router may send its next turn here.
    prefixes_->Record(r.prefix_key, static_cast<uint32_t>(e.prompt_tokens * r.prefix_covered));
    r.prefix_key = 0;
  }
  v1::TokenBatch b = Batch(r, e);
  if (role_->TakeEvent(r, e, b)) return;
  const bool final = e.finish_reason != worker::FinishReason::kNone;
  if (final) FillFinal(r, e, now, b);
  r.sink.on_batch(std::move(b));
  if (final) End(r.id, absl::OkStatus());
}

void LanguageCore::FillFinal(LiveRequest& r, const worker::StreamEvent& e, double now,
                             v1::TokenBatch& b) {
  b.set_finish_reason(FinishReasonToProto(e.finish_reason));
  b.set_matched_stop(e.matched_stop);
  if (r.include_usage) {
    mmserve::v1::Usage* u = b.mutable_usage();
    u->set_prompt_tokens(static_cast<uint32_t>(e.prompt_tokens));
    u->set_completion_tokens(static_cast<uint32_t>(e.completion_tokens));
    u->set_cached_prompt_tokens(static_cast<uint32_t>(e.cached_prompt_tokens));
    u->set_image_tokens(r.image_tokens);
  }
  b.set_seed(r.engine_request.sampling.seed);
  mmserve::v1::RequestTiming* t = b.mutable_timing();
  t->set_multimodal_ms(r.multimodal_ms);
  t->set_queue_ms(std::max(0.0, r.admitted_at_s * 1e3 - r.multimodal_ms));
  t->set_prefill_ms(std::max(0.0, (r.first_token_at_s - r.admitted_at_s) * 1e3));
  t->set_e2e_ms(now * 1e3);
  metrics_.e2e_seconds->Observe(now);
}

void LanguageCore::End(const std::string& id, absl::Status status) {
  std::unique_ptr<LiveRequest> r = requests_.Take(id);  // the id is free from here on
  if (r == nullptr) return;
  if (role_->Owns(*r)) {
    role_->Release(id, status);
  } else if (InEngine(r->phase) && r->phase != RequestPhase::kAborting && !status.ok()) {
    engine_->Abort(id).IgnoreError();
  }
  images_->Cancel(*r, status);
  r->sink.on_end(std::move(status));
}

void LanguageCore::CheckLostDeadlines() {
  const std::vector<std::string> expired = requests_.Ids(
      [](const LiveRequest& r) { return r.lost_deadline && r.lost_deadline->Expired(); });
  for (const std::string& id : expired) {
    End(id, absl::UnavailableError("an image's encoder failed and no other encoder took over"));
  }
}

void LanguageCore::EndInEngine(const absl::Status& why) {
  for (const std::string& id :
       requests_.Ids([](const LiveRequest& r) { return InEngine(r.phase); })) {
    End(id, why);
  }
}

void LanguageCore::LoseRank(const absl::Status& why) {
  EndInEngine(why);
  if (lost_rank_reported_) return;
  lost_rank_reported_ = true;
  // The instance is out of service for good (every later step fails the
  // same way): main stops it as on SIGTERM, so it leaves the router, and
  // its supervisor (the launcher) restarts it.
  LOG(ERROR) << "tensor-parallel instance lost a rank: " << why;
  loop_->ReportFatal(why);
}

void LanguageCore::StepEngine() {
  Stopwatch clock;
  absl::Status s = engine_->Step();
  const double step_s = clock.ElapsedSeconds();
  metrics_.step_seconds->Observe(step_s);
  constexpr double kStepWeight = 0.2;  // of the newest step in the average
  step_time_us_ = step_time_us_ == 0
                      ? step_s * 1e6
                      : (1 - kStepWeight) * step_time_us_ + kStepWeight * step_s * 1e6;
  last_batch_ = static_cast<uint32_t>(engine_->scheduler().num_running());
  const double handoff = engine_->embedding_handoff_seconds();
  if (handoff > engine_handoff_seconds_) {
    metrics_.handoff_blocked_seconds->Increment(handoff - engine_handoff_seconds_);
    engine_handoff_seconds_ = handoff;
  }
  const int64_t by_descriptor = engine_->embedding_rows_by_descriptor();
  const int64_t in_line = engine_->embedding_rows_inline();
  metrics_.rows_by_descriptor->Increment(
      static_cast<double>(by_descriptor - engine_rows_by_descriptor_));
  metrics_.rows_inline->Increment(static_cast<double>(in_line - engine_rows_inline_));
  engine_rows_by_descriptor_ = by_descriptor;
  engine_rows_inline_ = in_line;
  metrics_.grammar_mask_seconds->Increment(engine_->grammar_mask_seconds() - engine_mask_seconds_);
  metrics_.grammar_mask_wait_seconds->Increment(engine_->grammar_mask_wait_seconds() -
                                                engine_mask_wait_seconds_);
  engine_mask_seconds_ = engine_->grammar_mask_seconds();
  engine_mask_wait_seconds_ = engine_->grammar_mask_wait_seconds();
  if (s.ok()) return;
  LOG(ERROR) << "engine step failed: " << s;
  // UNAVAILABLE with tensor parallelism: a rank died.
  if (absl::IsUnavailable(s) && options_.engine.tp_size > 1) {
    LoseRank(absl::UnavailableError(s.message()));
    return;
  }
  EndInEngine(absl::IsUnavailable(s) ? absl::UnavailableError(s.message())
                                     : absl::InternalError(s.message()));
}

Deadline LanguageCore::StepHook() {
  if (shut_down_) return Deadline::Never();
  CheckLostDeadlines();
  // A rank that died while no step ran (an idle instance, or one whose
  // only request waits for its KV hand-off): out of service all the same.
  if (engine_->tp_group() != nullptr && engine_->tp_group()->lost_rank()) {
    LoseRank(absl::UnavailableError("a tensor-parallel rank of this instance died"));
  }
  if (engine_->has_unfinished()) StepEngine();
  const bool role_busy = role_->Step();
  UpdateLoad();
  // Lost-image deadlines are checked at least every kIdleWait.
  return engine_->has_unfinished() || role_busy ? Deadline::After(absl::ZeroDuration())
                                                : Deadline::After(kIdleWait);
}

void LanguageCore::OnShutDown() {
  shut_down_ = true;
  for (const std::string& id : requests_.Ids()) {
    End(id, absl::UnavailableError("the language instance is shutting down"));
  }
}

void LanguageCore::Shutdown() {
  if (!requests_.Close()) return;  // no new request from here on
  if (loop_ == nullptr) return;    // Create failed before starting it
  // Messages queued before ShutDown run first (transfer results free their
  // blocks); ShutDown ends every request; what comes after finds none.
  Post({Message::ShutDown{}});
  loop_->Stop();
  images_->Stop();
}

void LanguageCore::UpdateLoad() {
  v1::LoadReport load;
  load.set_instance_id(options_.instance_id);
  const scheduler::Scheduler& s = engine_->scheduler();
  // The role's own requests (a master's elastic decodes) run beside the batch.
  const size_t running = s.num_running() + role_->num_running();
  const size_t live = requests_.records().size();
  load.set_running(static_cast<uint32_t>(running));
  load.set_waiting(static_cast<uint32_t>(live - std::min(live, running)));
  uint64_t outstanding = 0;
  for (const auto& [id, r] : requests_.records()) {
    if (r->phase == RequestPhase::kGathering)
      outstanding += r->engine_request.prompt.size() / 4 + 1;
  }
  load.set_outstanding_tokens(outstanding + static_cast<uint64_t>(s.num_waiting()) * 64);
  load.set_kv_blocks_free(static_cast<uint32_t>(s.kv_cache().num_free_blocks()));
  load.set_kv_token_slots_free(static_cast<uint64_t>(s.kv_cache().num_free_blocks()) *
                               static_cast<uint64_t>(s.kv_cache().block_size()));
  load.set_step_time_us(static_cast<uint32_t>(step_time_us_));
  load.set_batch_size(last_batch_);
  load.set_embedding_blocks_free(transfer_.allocator().free_blocks());
  load.set_accepting(true);
  prefixes_->Fill(load);
  absl::MutexLock lock(&load_mu_);
  load_ = std::move(load);
}

v1::LoadReport LanguageCore::Load() const {
  absl::MutexLock lock(&load_mu_);
  return load_;
}

v1::Capacity LanguageCore::Capacity() const {
  v1::Capacity c;
  c.set_kv_blocks_total(static_cast<uint32_t>(engine_->sizing().num_kv_blocks));
  c.set_kv_block_size(static_cast<uint32_t>(engine_->scheduler().kv_cache().block_size()));
  c.set_embedding_blocks_total(transfer_.allocator().num_blocks());
  c.set_embedding_block_size(transfer_.allocator().block_size());
  c.set_max_model_len(static_cast<uint32_t>(engine_->sizing().max_model_len));
  return c;
}

size_t LanguageCore::num_requests() const { return requests_.size(); }

}  // namespace mmserve::language
