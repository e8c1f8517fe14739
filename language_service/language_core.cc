#include "language_service/language_core.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "language_service/language_core_request.h"
#include "model/chat_template.h"
#include "model/sampling_proto.h"
#include "proto/encoder.grpc.pb.h"

namespace mmserve::language {
namespace {

constexpr absl::Duration kIdleWait = absl::Milliseconds(50);

mmserve::v1::FinishReason ToProto(worker::FinishReason r) {
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

// The prompt text: the chat rendered with the model's template, or the raw
// text. Image parts become one placeholder each; their count must match.
absl::StatusOr<std::string> RenderPrompt(const v1::PrefillRequest& request, int* num_images) {
  *num_images = 0;
  if (request.has_chat()) {
    std::vector<model::ChatMessage> messages;
    for (const mmserve::v1::ChatMessage& m : request.chat().messages()) {
      model::ChatMessage cm;
      cm.role = m.role();
      for (const mmserve::v1::ContentPart& p : m.content()) {
        if (p.has_image()) {
          cm.parts.push_back({model::ChatPart::Kind::kImage, ""});
          ++*num_images;
        } else {
          cm.parts.push_back({model::ChatPart::Kind::kText, p.text()});
        }
      }
      messages.push_back(std::move(cm));
    }
    model::ChatOptions opts;
    opts.add_generation_prompt =
        !request.chat().has_add_generation_prompt() || request.chat().add_generation_prompt();
    return model::RenderQwen2VlChat(messages, opts);
  }
  if (request.has_raw()) {
    const std::string& text = request.raw().text();
    for (size_t at = text.find(model::kQwen2VlImagePlaceholder); at != std::string::npos;
         at = text.find(model::kQwen2VlImagePlaceholder, at + 1)) {
      ++*num_images;
    }
    return text;
  }
  return absl::InvalidArgumentError("the request has no prompt (chat or raw)");
}

}  // namespace

LanguageCore::LanguageCore(const LanguageCoreOptions& options, transfer::TransferEngine& transfer,
                           metrics::Registry& metrics)
    : options_(options), transfer_(transfer) {
  resumes_ = &metrics.GetCounter("mmserve_language_resumes_total",
                                 "Embedding transfers that needed more than one chunk.");
  transfer_bytes_ =
      &metrics.GetCounter("mmserve_language_transfer_bytes_total", "Embedding bytes received.");
  lost_images_ = &metrics.GetCounter("mmserve_language_lost_images_total",
                                     "Images whose encoder failed during the transfer.");
  images_received_ =
      &metrics.GetCounter("mmserve_language_images_received_total", "Images fully received.");
  transfer_seconds_ = &metrics.GetHistogram("mmserve_language_transfer_seconds",
                                            "From asking for an image to holding all of it.",
                                            metrics::LatencyBuckets());
  ttft_seconds_ = &metrics.GetHistogram("mmserve_language_ttft_seconds", "Submit to first token.",
                                        metrics::LatencyBuckets());
  itl_seconds_ = &metrics.GetHistogram("mmserve_language_itl_seconds",
                                       "Gap between consecutive tokens of a request.",
                                       metrics::LatencyBuckets());
  e2e_seconds_ = &metrics.GetHistogram("mmserve_language_e2e_seconds", "Submit to last token.",
                                       metrics::LatencyBuckets());
  step_seconds_ = &metrics.GetHistogram("mmserve_language_step_seconds",
                                        "One engine step (schedule, forward, sample).",
                                        metrics::LatencyBuckets());
  handoff_blocked_seconds_ = &metrics.GetCounter(
      "mmserve_language_mm_handoff_blocked_seconds_total",
      "Loop CPU time spent moving image embeddings: copying them out of the receive buffer and "
      "putting image rows (their floats, or descriptors) into tensor-parallel steps (seed 000).");
  const char* rows_help =
      "Image embedding rows rank 0 sent to the other tensor-parallel ranks, by placement "
      "(descriptor: an offset into the receive buffer every rank maps; inline: the floats in the "
      "step).";
  rows_by_descriptor_ = &metrics.GetCounter("mmserve_language_mm_rows_total", rows_help,
                                            {{"placement", "descriptor"}});
  rows_inline_ =
      &metrics.GetCounter("mmserve_language_mm_rows_total", rows_help, {{"placement", "inline"}});
}

absl::StatusOr<std::unique_ptr<LanguageCore>> LanguageCore::Create(
    const LanguageCoreOptions& options, transfer::TransferEngine& transfer,
    metrics::Registry& metrics) {
  if (options.role == LanguageRole::kPrefill && options.engine.tp_size > 1) {
    return absl::UnimplementedError("role prefill needs tp_size 1 for now (decode takes --tp)");
  }
  std::unique_ptr<LanguageCore> core(new LanguageCore(options, transfer, metrics));
  worker::EngineOptions eo = options.engine;
  eo.load_vision = false;
  if (options.role == LanguageRole::kDecode && eo.tp_size > 1) {
    eo.tp_shard_args.push_back(
        absl::StrCat("--kv_handoff_profile=", transfer::TransportProfileName(options.kv_profile)));
  }
  std::unique_ptr<worker::KvConnector> role;  // role both: none
  if (options.role == LanguageRole::kPrefill) {
    role = std::make_unique<worker::PrefillKvConnector>();
  } else if (options.role == LanguageRole::kDecode) {
    role = std::make_unique<worker::DecodeKvConnector>(
        worker::DecodeKvConnector::Options{.commit_timeout = options.kv_commit_timeout});
  }
  ASSIGN_OR_RETURN(core->engine_, worker::LlmEngine::Create(eo, std::move(role)));
  const transfer::EmbeddingLayout& layout = transfer.buffer().layout();
  if (core->config().vision &&
      (layout.hidden_size != static_cast<uint32_t>(core->config().text.hidden_size) ||
       layout.dtype_bytes != sizeof(float))) {
    return absl::InvalidArgumentError("embedding buffer does not match the model's hidden size");
  }
  if (options.role != LanguageRole::kBoth) {
    ASSIGN_OR_RETURN(core->kv_context_, transfer::UcxContext::Create(options.kv_profile));
    const transfer::UcxWorkerOptions wo{.name = options.instance_id + "-kv"};
    if (options.role == LanguageRole::kDecode) {
      // Every rank receives its own KV heads (worker/tp_kv_receiver.h).
      worker::TpGroup* group = core->engine_->tp_group();
      ASSIGN_OR_RETURN(core->kv_receivers_, worker::TpKvReceivers::Create(
                                                *core->kv_context_, core->engine_->kv_cache(),
                                                group != nullptr ? group->ring() : nullptr,
                                                group != nullptr ? group->comm() : nullptr, wo));
    } else {
      ASSIGN_OR_RETURN(core->kv_sender_, transfer::KvHandoffSender::Create(
                                             *core->kv_context_, core->engine_->kv_cache(), wo));
    }
  }
  core->UpdateLoad();
  core->loop_ = std::thread([c = core.get()] { c->Loop(); });
  core->connector_ = std::thread([c = core.get()] { c->ConnectLoop(); });
  return core;
}

LanguageCore::~LanguageCore() { Shutdown(); }

void LanguageCore::Post(Task task) {
  absl::MutexLock lock(&mu_);
  inbox_.push_back(std::move(task));
}

absl::Status LanguageCore::Submit(const v1::PrefillRequest& request, RequestSink sink) {
  if (request.request_id().empty()) return absl::InvalidArgumentError("request_id is empty");
  switch (options_.role) {
    case LanguageRole::kBoth:
      if (!request.decode().instance_id().empty()) {
        return absl::InvalidArgumentError("role both hands no KV to a decode instance");
      }
      break;
    case LanguageRole::kPrefill:
      if (request.decode().address().empty()) {
        return absl::InvalidArgumentError("role prefill needs the decode instance (decode)");
      }
      break;
    case LanguageRole::kDecode:
      return absl::FailedPreconditionError("role decode takes Decode calls, not Prefill");
  }
  int num_placeholders = 0;
  ASSIGN_OR_RETURN(std::string prompt, RenderPrompt(request, &num_placeholders));
  if (num_placeholders != request.images_size()) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", num_placeholders,
                                                   " image parts but the request describes ",
                                                   request.images_size(), " images"));
  }
  if (request.images_size() > 0 && !config().vision) {
    return absl::InvalidArgumentError("this model does not accept images");
  }
  auto r = std::make_unique<Request>();
  r->id = request.request_id();
  r->sink = std::move(sink);
  r->engine_request.id = r->id;
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
  r->include_usage = !request.stream().has_include_usage() || request.stream().include_usage();
  if (options_.role == LanguageRole::kPrefill) {
    // Token ids now: they travel in AllocateKv and KvCommit.
    if (r->engine_request.prompt_token_ids.empty()) {
      ASSIGN_OR_RETURN(r->engine_request.prompt_token_ids,
                       engine_->tokenizer().Encode(r->engine_request.prompt));
    }
    r->engine_request.prompt.clear();
    r->decode = request.decode();
  }
  for (const v1::PromptImage& image : request.images()) {
    if (image.encoder_id().empty() || image.encoder_address().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("image ", image.image_index(), " names no encoder"));
    }
    Request::Image im;
    im.meta = image;
    r->images.push_back(std::move(im));
  }
  return Install(std::move(r), [this](Request& rr) {
    for (size_t k = 0; k < rr.images.size(); ++k) StartImage(rr, k);
    std::vector<v1::ImageRetry> early;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = early_retries_.begin(); it != early_retries_.end();) {
        if (it->first.request_id() == rr.id) {
          early.push_back(std::move(it->first));
          it = early_retries_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const v1::ImageRetry& retry : early) ApplyRetry(rr, retry);
    MaybeAdmit(rr);
  });
}

absl::Status LanguageCore::Install(std::unique_ptr<Request> r, std::function<void(Request&)> then) {
  // The id and the task that installs the request go in under one lock: a
  // caller that sees the id (num_requests) and then posts (AllocateKv) finds
  // the request installed.
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the language instance is shutting down");
  if (!ids_.emplace(r->id, true).second) {
    return absl::AlreadyExistsError(absl::StrCat("request ", r->id, " is already running"));
  }
  inbox_.push_back(
      [this, req = std::shared_ptr<Request>(std::move(r)), then = std::move(then)]() mutable {
        auto owned = std::make_unique<Request>(std::move(*req));
        Request& installed = *owned;
        requests_[installed.id] = std::move(owned);
        then(installed);
      });
  return absl::OkStatus();
}

void LanguageCore::Abort(const std::string& request_id, const std::string& reason) {
  Post([this, request_id, reason] {
    auto it = requests_.find(request_id);
    if (it == requests_.end()) return;
    Request& r = *it->second;
    if (r.in_engine) {
      r.aborting = true;
      engine_->Abort(request_id).IgnoreError();  // its event ends the request
      return;
    }
    End(request_id, absl::CancelledError(reason));
  });
}

void LanguageCore::OnEvent(const worker::StreamEvent& e) {
  auto it = requests_.find(e.request_id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  if (r.aborting) {
    End(r.id, absl::CancelledError("aborted"));
    return;
  }
  if (options_.role == LanguageRole::kDecode && e.finish_reason == worker::FinishReason::kAbort) {
    End(r.id, e.error.ok() ? absl::DeadlineExceededError(
                                 "the prefill instance did not commit the KV in time")
                           : e.error);
    return;
  }
  if (!e.token_ids.empty()) r.last_token = e.token_ids.back();
  const double now = r.since_submit.ElapsedSeconds();
  if (!e.token_ids.empty()) {
    if (r.last_token_at_s < 0) {
      r.first_token_at_s = now;
      ttft_seconds_->Observe(now);
    } else {
      itl_seconds_->Observe(now - r.last_token_at_s);
    }
    r.last_token_at_s = now;
  }
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
  if (e.finish_reason == worker::FinishReason::kHandoff) {
    absl::Status s = HandOff(r, e.kv_blocks, e.handoff);
    if (!s.ok()) {
      End(r.id, s);
      return;
    }
    b.set_kv_handed_off(true);
    mmserve::v1::RequestTiming* t = b.mutable_timing();
    t->set_queue_ms(std::max(0.0, r.admitted_at_s * 1e3));
    t->set_prefill_ms(std::max(0.0, (r.first_token_at_s - r.admitted_at_s) * 1e3));
    r.sink.on_batch(std::move(b));
    End(r.id, absl::OkStatus());
    return;
  }
  if (e.finish_reason != worker::FinishReason::kNone) {
    b.set_finish_reason(ToProto(e.finish_reason));
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
    e2e_seconds_->Observe(now);
  }
  const bool final = e.finish_reason != worker::FinishReason::kNone;
  r.sink.on_batch(std::move(b));
  if (final) End(r.id, absl::OkStatus());
}

void LanguageCore::End(const std::string& id, absl::Status status) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  std::unique_ptr<Request> r = std::move(it->second);
  requests_.erase(it);
  if (r->in_engine && !status.ok() && !r->aborting) engine_->Abort(id).IgnoreError();
  std::set<std::string> cancel;
  for (size_t k = 0; k < r->images.size(); ++k) {
    if (r->images[k].state == Request::ImageState::kReceiving) cancel.insert(r->TransferId(k));
  }
  for (const std::string& t : cancel) transfer_.Cancel(t, std::string(status.message()));
  {
    absl::MutexLock lock(&mu_);
    ids_.erase(id);
  }
  r->sink.on_end(std::move(status));
}

void LanguageCore::CheckLostDeadlines() {
  std::vector<std::string> expired;
  for (const auto& [id, r] : requests_) {
    if (r->lost_deadline && r->lost_deadline->Expired()) expired.push_back(id);
  }
  for (const std::string& id : expired) {
    End(id, absl::UnavailableError("an image's encoder failed and no other encoder took over"));
  }
}

void LanguageCore::Loop() {
  for (;;) {
    std::deque<Task> tasks;
    {
      absl::MutexLock lock(&mu_);
      if (!engine_->has_unfinished()) {
        mu_.AwaitWithTimeout(absl::Condition(
                                 +[](LanguageCore* c) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                   return c->stopping_ || !c->inbox_.empty();
                                 },
                                 this),
                             kIdleWait);
      }
      if (stopping_) break;
      tasks.swap(inbox_);
    }
    for (Task& t : tasks) t();
    CheckLostDeadlines();
    // A rank that died while no step ran (an idle instance, or one whose
    // only request waits for its KV hand-off): out of service all the same.
    if (!lost_rank_reported_ && engine_->tp_group() != nullptr &&
        engine_->tp_group()->lost_rank()) {
      lost_rank_reported_ = true;
      LOG(ERROR) << "tensor-parallel instance lost a rank between steps: shutting down";
      std::vector<std::string> live;
      for (const auto& [id, r] : requests_) {
        if (r->in_engine) live.push_back(id);
      }
      for (const std::string& id : live) {
        End(id, absl::UnavailableError("a tensor-parallel rank of this instance died"));
      }
      kill(getpid(), SIGTERM);
    }
    if (engine_->has_unfinished()) {
      Stopwatch clock;
      absl::Status s = engine_->Step();
      step_seconds_->Observe(clock.ElapsedSeconds());
      const double handoff = engine_->embedding_handoff_seconds();
      if (handoff > engine_handoff_seconds_) {
        handoff_blocked_seconds_->Increment(handoff - engine_handoff_seconds_);
        engine_handoff_seconds_ = handoff;
      }
      const int64_t by_descriptor = engine_->embedding_rows_by_descriptor();
      const int64_t in_line = engine_->embedding_rows_inline();
      rows_by_descriptor_->Increment(
          static_cast<double>(by_descriptor - engine_rows_by_descriptor_));
      rows_inline_->Increment(static_cast<double>(in_line - engine_rows_inline_));
      engine_rows_by_descriptor_ = by_descriptor;
      engine_rows_inline_ = in_line;
      if (!s.ok()) {
        LOG(ERROR) << "engine step failed: " << s;
        std::vector<std::string> live;
        for (const auto& [id, r] : requests_) {
          if (r->in_engine) live.push_back(id);
        }
        // UNAVAILABLE: a tensor-parallel rank died; the instance is out of
        // service for good (every later step fails the same way), so after
        // ending its requests it stops like on SIGTERM: it leaves the router
        // and exits, and its supervisor (the launcher) restarts it.
        const bool lost_rank = absl::IsUnavailable(s) && options_.engine.tp_size > 1;
        const absl::Status why = absl::IsUnavailable(s) ? absl::UnavailableError(s.message())
                                                        : absl::InternalError(s.message());
        for (const std::string& id : live) End(id, why);
        if (lost_rank && !lost_rank_reported_) {
          lost_rank_reported_ = true;
          LOG(ERROR) << "tensor-parallel instance lost a rank: shutting down";
          kill(getpid(), SIGTERM);
        }
      }
    }
    UpdateLoad();
  }
  // Shutting down: run what was posted (transfer results free their blocks),
  // then end every request.
  std::deque<Task> tasks;
  {
    absl::MutexLock lock(&mu_);
    tasks.swap(inbox_);
  }
  for (Task& t : tasks) t();
  std::vector<std::string> live;
  for (const auto& [id, r] : requests_) live.push_back(id);
  for (const std::string& id : live) {
    End(id, absl::UnavailableError("the language instance is shutting down"));
  }
}

void LanguageCore::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
  if (connector_.joinable()) connector_.join();
}

void LanguageCore::UpdateLoad() {
  v1::LoadReport load;
  load.set_instance_id(options_.instance_id);
  const scheduler::Scheduler& s = engine_->scheduler();
  load.set_running(static_cast<uint32_t>(s.num_running()));
  load.set_waiting(static_cast<uint32_t>(requests_.size()) -
                   static_cast<uint32_t>(s.num_running()));
  uint64_t outstanding = 0;
  for (const auto& [id, r] : requests_) {
    if (!r->in_engine) outstanding += r->engine_request.prompt.size() / 4 + 1;
  }
  load.set_outstanding_tokens(outstanding + static_cast<uint64_t>(s.num_waiting()) * 64);
  load.set_kv_blocks_free(static_cast<uint32_t>(s.kv_cache().num_free_blocks()));
  load.set_embedding_blocks_free(transfer_.allocator().free_blocks());
  load.set_accepting(true);
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

size_t LanguageCore::num_requests() const {
  absl::MutexLock lock(&const_cast<LanguageCore*>(this)->mu_);
  return ids_.size();
}

}  // namespace mmserve::language
