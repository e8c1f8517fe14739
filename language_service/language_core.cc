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

struct LanguageCore::Connection {
  std::string address;
  enum class State { kNone, kConnecting, kConnected } state = State::kNone;
  // (request id, image) waiting for the connection.
  std::vector<std::pair<std::string, size_t>> waiting;
};

struct LanguageCore::Request {
  std::string id;
  worker::EngineRequest engine_request;  // prompt, sampling; embeddings filled on arrival
  RequestSink sink;
  enum class ImageState { kConnecting, kReceiving, kArrived, kLost };
  struct Image {
    v1::PromptImage meta;
    ImageState state = ImageState::kConnecting;
    Stopwatch started;
    worker::ImageEmbedding embedding;
  };
  std::vector<Image> images;
  bool in_engine = false;
  bool aborting = false;
  bool include_usage = true;
  uint32_t image_tokens = 0;
  Stopwatch since_submit;
  double multimodal_ms = 0;
  double admitted_at_s = -1;
  double last_token_at_s = -1;
  double first_token_at_s = -1;
  std::optional<Deadline> lost_deadline;
  // Role prefill: where the KV goes, and the last token sampled.
  v1::DecodeTarget decode;
  int32_t last_token = -1;
  std::vector<int32_t> prompt_ids;  // engine_request's moves into the engine
  // Role decode: the reserved blocks (after AllocateKv).
  std::vector<int32_t> kv_blocks;

  const std::string& TransferId(size_t k) const {
    return images[k].meta.transfer_id().empty() ? id : images[k].meta.transfer_id();
  }
};

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
}

absl::StatusOr<std::unique_ptr<LanguageCore>> LanguageCore::Create(
    const LanguageCoreOptions& options, transfer::TransferEngine& transfer,
    metrics::Registry& metrics) {
  std::unique_ptr<LanguageCore> core(new LanguageCore(options, transfer, metrics));
  worker::EngineOptions eo = options.engine;
  eo.load_vision = false;
  ASSIGN_OR_RETURN(core->engine_, worker::LlmEngine::Create(eo));
  const transfer::EmbeddingLayout& layout = transfer.buffer().layout();
  if (core->config().vision &&
      (layout.hidden_size != static_cast<uint32_t>(core->config().text.hidden_size) ||
       layout.dtype_bytes != sizeof(float))) {
    return absl::InvalidArgumentError("embedding buffer does not match the model's hidden size");
  }
  if (options.role != LanguageRole::kBoth) {
    if (options.engine.tp_size > 1) {
      return absl::UnimplementedError("roles prefill and decode need tp_size 1 for now");
    }
    ASSIGN_OR_RETURN(core->kv_context_, transfer::UcxContext::Create(options.kv_profile));
    const transfer::UcxWorkerOptions wo{.name = options.instance_id + "-kv"};
    if (options.role == LanguageRole::kDecode) {
      ASSIGN_OR_RETURN(core->kv_receiver_, transfer::KvHandoffReceiver::Create(
                                               *core->kv_context_, core->engine_->kv_cache(), wo));
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

template <typename T>
T LanguageCore::RunOnLoop(std::function<T()> f) {
  auto done = std::make_shared<absl::Notification>();
  auto result = std::make_shared<std::optional<T>>();
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the language instance is shutting down");
    inbox_.push_back([f = std::move(f), done, result] {
      *result = f();
      done->Notify();
    });
  }
  done->WaitForNotification();
  return std::move(**result);
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
      if (request.images_size() > 0) {
        return absl::UnimplementedError("role prefill hands off text prompts only for now");
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
    r->engine_request.kv_handoff = true;
    r->prompt_ids = r->engine_request.prompt_token_ids;
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
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the language instance is shutting down");
    if (!ids_.emplace(r->id, true).second) {
      return absl::AlreadyExistsError(absl::StrCat("request ", r->id, " is already running"));
    }
  }
  Post([this, req = std::shared_ptr<Request>(std::move(r))]() mutable {
    auto owned = std::make_unique<Request>(std::move(*req));
    Request& rr = *owned;
    requests_[rr.id] = std::move(owned);
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
  return absl::OkStatus();
}

absl::Status LanguageCore::RegisterDecode(const v1::DecodeRequest& request, RequestSink sink) {
  if (options_.role != LanguageRole::kDecode) {
    return absl::UnimplementedError("only role decode takes Decode calls (use --role=decode)");
  }
  if (request.request_id().empty()) return absl::InvalidArgumentError("request_id is empty");
  auto r = std::make_unique<Request>();
  r->id = request.request_id();
  r->sink = std::move(sink);
  r->engine_request.id = r->id;
  ASSIGN_OR_RETURN(
      r->engine_request.sampling,
      model::SamplingFromProto(request.sampling(), config(), engine_->sizing().max_model_len,
                               &r->engine_request.max_tokens_to_context));
  r->include_usage = !request.stream().has_include_usage() || request.stream().include_usage();
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the language instance is shutting down");
    if (!ids_.emplace(r->id, true).second) {
      return absl::AlreadyExistsError(absl::StrCat("request ", r->id, " is already running"));
    }
  }
  Post([this, req = std::shared_ptr<Request>(std::move(r))]() mutable {
    auto owned = std::make_unique<Request>(std::move(*req));
    Request& r = *owned;
    requests_[r.id] = std::move(owned);
    // An empty first batch: the request is held here, AllocateKv may come.
    v1::TokenBatch registered;
    registered.set_request_id(r.id);
    r.sink.on_batch(std::move(registered));
  });
  return absl::OkStatus();
}

absl::StatusOr<v1::KvAllocation> LanguageCore::AllocateKv(const v1::KvAllocateRequest& request) {
  if (options_.role != LanguageRole::kDecode) {
    return absl::UnimplementedError("only role decode takes KV hand-offs (use --role=decode)");
  }
  if (request.prompt_token_ids_size() == 0) {
    return absl::InvalidArgumentError("AllocateKv needs the prompt's token ids");
  }
  return RunOnLoop<absl::StatusOr<v1::KvAllocation>>(
      [this, &request]() -> absl::StatusOr<v1::KvAllocation> {
        auto it = requests_.find(request.request_id());
        if (it == requests_.end()) {
          return absl::FailedPreconditionError(
              absl::StrCat("request ", request.request_id(), " has no open Decode call here"));
        }
        Request& r = *it->second;
        if (r.in_engine) {
          return absl::FailedPreconditionError(
              absl::StrCat("request ", r.id, " already has its KV allocated"));
        }
        worker::EngineRequest er = r.engine_request;
        er.prompt_token_ids.assign(request.prompt_token_ids().begin(),
                                   request.prompt_token_ids().end());
        er.sampling.seed = request.seed();
        r.engine_request.sampling.seed = request.seed();
        ASSIGN_OR_RETURN(worker::RemoteKvBlocks blocks,
                         engine_->ReserveRemoteKv(
                             std::move(er), [this](const worker::StreamEvent& e) { OnEvent(e); },
                             Deadline::After(options_.kv_commit_timeout)));
        r.in_engine = true;
        r.kv_blocks = blocks.blocks;
        r.admitted_at_s = r.since_submit.ElapsedSeconds();
        // The engine's earlier reads of these (reused) blocks before the puts.
        RETURN_IF_ERROR(kv_receiver_->AwaitLandedWrites());
        const transfer::KvHandoffTarget& t = kv_receiver_->target();
        v1::KvAllocation a;
        a.set_request_id(r.id);
        a.set_num_tokens(static_cast<uint32_t>(request.prompt_token_ids_size()));
        a.set_num_cached_tokens(static_cast<uint32_t>(blocks.num_cached_tokens));
        v1::KvRankTarget* rank = a.add_ranks();
        rank->mutable_peer()->set_worker_address(t.worker_address);
        rank->mutable_peer()->set_transport_profile(
            options_.kv_profile == transfer::TransportProfile::kShm ? "shm" : "tcp");
        v1::KvLayout* l = rank->mutable_layout();
        l->set_num_layers(static_cast<uint32_t>(t.shape.num_layers));
        l->set_num_kv_heads(static_cast<uint32_t>(t.shape.num_kv_heads));
        l->set_head_dim(static_cast<uint32_t>(t.shape.head_dim));
        l->set_block_size(static_cast<uint32_t>(t.shape.block_size));
        l->set_num_blocks(static_cast<uint32_t>(t.shape.num_blocks));
        l->set_dtype(v1::TENSOR_DTYPE_FLOAT32);
        l->set_tp_rank(0);
        l->set_tp_size(1);
        rank->mutable_kv_region()->set_base_address(t.base_address);
        rank->mutable_kv_region()->set_length(t.shape.TotalBytes());
        rank->mutable_kv_region()->set_rkey(t.rkey);
        for (int32_t b : blocks.blocks) rank->add_block_ids(static_cast<uint32_t>(b));
        return a;
      });
}

absl::Status LanguageCore::CommitKv(const v1::KvCommit& commit) {
  if (options_.role != LanguageRole::kDecode) {
    return absl::UnimplementedError("only role decode takes KV hand-offs (use --role=decode)");
  }
  if (commit.rank_crc32c_size() != 1) {
    return absl::InvalidArgumentError("KvCommit needs one CRC32C per rank (tp_size 1)");
  }
  return RunOnLoop<absl::Status>([this, &commit]() -> absl::Status {
    auto it = requests_.find(commit.request_id());
    if (it == requests_.end() || !it->second->in_engine) {
      return absl::FailedPreconditionError(
          absl::StrCat("request ", commit.request_id(), " has no KV allocated here"));
    }
    Request& r = *it->second;
    RETURN_IF_ERROR(kv_receiver_->AwaitLandedWrites());
    const uint32_t crc = transfer::KvBlocksCrc(engine_->kv_cache(), r.kv_blocks);
    if (crc != commit.rank_crc32c(0)) {
      const absl::Status why = absl::DataLossError(absl::StrCat(
          "request ", r.id, ": KV CRC32C ", crc, " != committed ", commit.rank_crc32c(0)));
      End(r.id, why);
      return why;
    }
    return engine_->CommitRemoteKv(r.id, static_cast<int32_t>(commit.first_token_id()));
  });
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

bool LanguageCore::Retry(const v1::ImageRetry& retry) {
  {
    absl::MutexLock lock(&mu_);
    if (ids_.count(retry.request_id()) == 0) {
      // The retry may overtake the Prefill call it belongs to (separate
      // RPCs): keep it for a while and apply it when the request arrives.
      early_retries_.push_back({retry, Deadline::After(options_.lost_image_timeout)});
      while (!early_retries_.empty() && early_retries_.front().second.Expired()) {
        early_retries_.pop_front();
      }
      return true;
    }
  }
  Post([this, retry] {
    auto it = requests_.find(retry.request_id());
    if (it != requests_.end()) ApplyRetry(*it->second, retry);
  });
  return true;
}

void LanguageCore::ApplyRetry(Request& r, const v1::ImageRetry& retry) {
  std::set<size_t> moving;
  for (const v1::PromptImage& image : retry.images()) moving.insert(image.image_index());
  for (const v1::PromptImage& image : retry.images()) {
    const size_t k = image.image_index();
    if (k >= r.images.size() || r.images[k].state == Request::ImageState::kArrived) continue;
    if (r.images[k].state != Request::ImageState::kLost) {
      // The router moved an image whose source has not failed here: stop
      // that transfer; its other unfinished images not moved with it are
      // lost with it.
      const std::string old = r.TransferId(k);
      for (size_t j = 0; j < r.images.size(); ++j) {
        if (moving.count(j) && r.TransferId(j) == old) {
          r.images[j].state = Request::ImageState::kLost;
        }
      }
      LoseImages(r, old, absl::UnavailableError("moved by the router"));
    }
    r.images[k].meta = image;
    r.images[k].started = Stopwatch();
    StartImage(r, k);
  }
  bool lost = false;
  for (const auto& im : r.images) lost |= im.state == Request::ImageState::kLost;
  if (!lost) r.lost_deadline.reset();
}

void LanguageCore::StartImage(Request& r, size_t k) {
  Request::Image& im = r.images[k];
  im.state = Request::ImageState::kConnecting;
  auto& conn = connections_[im.meta.encoder_id()];
  if (conn == nullptr) conn = std::make_unique<Connection>();
  if (conn->address != im.meta.encoder_address()) {
    conn->address = im.meta.encoder_address();
    conn->state = Connection::State::kNone;
  }
  switch (conn->state) {
    case Connection::State::kConnected:
      StartReceive(r, k);
      return;
    case Connection::State::kConnecting:
      conn->waiting.emplace_back(r.id, k);
      return;
    case Connection::State::kNone:
      conn->state = Connection::State::kConnecting;
      conn->waiting.emplace_back(r.id, k);
      absl::MutexLock lock(&mu_);
      connects_.emplace_back(im.meta.encoder_id(), conn->address);
      return;
  }
}

void LanguageCore::ConnectLoop() {
  for (;;) {
    std::pair<std::string, std::string> job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](LanguageCore* c)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return c->stopping_ || !c->connects_.empty(); },
          this));
      if (stopping_) return;
      job = connects_.front();
      connects_.pop_front();
    }
    auto stub = v1::Encoder::NewStub(InternalChannel(job.second));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     absl::ToChronoNanoseconds(options_.connect_timeout));
    v1::ConnectResponse resp;
    grpc::Status gs = stub->Connect(&ctx, transfer_.local_info(), &resp);
    absl::Status status;
    if (!gs.ok()) {
      status = absl::UnavailableError(absl::StrCat("connect to encoder ", job.first, " at ",
                                                   job.second, ": ", gs.error_message()));
    } else if (resp.instance_id() != job.first) {
      status = absl::UnavailableError(
          absl::StrCat("encoder at ", job.second, " is ", resp.instance_id(), ", not ", job.first));
    } else {
      v1::ConnectRequest peer;
      peer.set_instance_id(resp.instance_id());
      *peer.mutable_ucx() = resp.ucx();
      *peer.mutable_embedding_buffer() = resp.embedding_buffer();
      status = transfer_.Connect(peer);
    }
    if (status.ok()) LOG(INFO) << "connected to encoder " << job.first << " at " << job.second;
    Post([this, job, status] { OnConnected(job.first, job.second, status); });
  }
}

void LanguageCore::OnConnected(const std::string& encoder, const std::string& address,
                               absl::Status status) {
  auto& conn = connections_[encoder];
  if (conn == nullptr || conn->address != address) return;  // superseded
  conn->state = status.ok() ? Connection::State::kConnected : Connection::State::kNone;
  std::vector<std::pair<std::string, size_t>> waiting = std::move(conn->waiting);
  conn->waiting.clear();
  for (const auto& [id, k] : waiting) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    Request& r = *it->second;
    if (k >= r.images.size() || r.images[k].state != Request::ImageState::kConnecting ||
        r.images[k].meta.encoder_id() != encoder) {
      continue;
    }
    if (status.ok()) {
      StartReceive(r, k);
    } else {
      LoseImages(r, r.TransferId(k), status);
    }
  }
}

void LanguageCore::StartReceive(Request& r, size_t k) {
  Request::Image& im = r.images[k];
  im.state = Request::ImageState::kReceiving;
  transfer::ReceiveRequest rr;
  rr.request_id = r.TransferId(k);
  rr.image_index = static_cast<uint32_t>(k);
  rr.sender = im.meta.encoder_id();
  rr.known_tokens = im.meta.num_tokens();
  rr.timeout = options_.transfer_timeout;
  transfer_.Receive(std::move(rr), [this, id = r.id, k, tid = r.TransferId(k)](
                                       absl::StatusOr<transfer::ReceivedImage> image) {
    auto shared = std::make_shared<absl::StatusOr<transfer::ReceivedImage>>(std::move(image));
    Post([this, id, k, tid, shared] { OnImage(id, k, tid, std::move(*shared)); });
  });
}

void LanguageCore::OnImage(const std::string& id, size_t k, const std::string& transfer_id,
                           absl::StatusOr<transfer::ReceivedImage> image) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  if (k >= r.images.size() || r.TransferId(k) != transfer_id ||
      r.images[k].state != Request::ImageState::kReceiving) {
    return;  // a superseded source
  }
  if (!image.ok()) {
    if (image.status().code() == absl::StatusCode::kUnavailable ||
        image.status().code() == absl::StatusCode::kDeadlineExceeded) {
      // The encoder may be gone: reconnect before its next use.
      auto c = connections_.find(r.images[k].meta.encoder_id());
      if (c != connections_.end() && c->second->state == Connection::State::kConnected) {
        c->second->state = Connection::State::kNone;
      }
    }
    LoseImages(r, transfer_id, image.status());
    return;
  }
  // The grid from the M-RoPE section (t, row, column of each merged token):
  // exact whether or not the router could pre-size the image.
  const uint32_t n = image->total_tokens();
  const std::string mrope = image->Section(transfer::kMrope);
  const std::string emb = image->Section(transfer::kEmbedding);
  image->Release();
  int32_t t_max = 0, h_max = 0, w_max = 0;
  for (uint32_t i = 0; i < n; ++i) {
    int32_t p[3];
    std::memcpy(p, mrope.data() + 12 * i, 12);
    t_max = std::max(t_max, p[0]);
    h_max = std::max(h_max, p[1]);
    w_max = std::max(w_max, p[2]);
  }
  const int merge = config().vision ? config().vision->spatial_merge_size : 2;
  worker::ImageEmbedding& e = r.images[k].embedding;
  e.grid = model::ImageGrid::FromThw(t_max + 1, (h_max + 1) * merge, (w_max + 1) * merge, merge);
  if (e.grid.num_tokens() != static_cast<int64_t>(n)) {
    LoseImages(r, transfer_id,
               absl::DataLossError(absl::StrCat("image ", k, ": M-RoPE section of ", n,
                                                " tokens does not describe a grid")));
    return;
  }
  e.values.resize(emb.size() / sizeof(float));
  std::memcpy(e.values.data(), emb.data(), e.values.size() * sizeof(float));
  const auto& h = r.images[k].meta.content_hash();
  e.key = ContentHash{h.high(), h.low()};
  r.images[k].state = Request::ImageState::kArrived;
  r.image_tokens += n;
  images_received_->Increment();
  transfer_bytes_->Increment(static_cast<double>(n) * transfer_.buffer().layout().BytesPerToken());
  transfer_seconds_->Observe(r.images[k].started.ElapsedSeconds());
  if (image->num_chunks() > 1) resumes_->Increment(image->num_chunks() - 1);
  MaybeAdmit(r);
}

void LanguageCore::LoseImages(Request& r, const std::string& transfer_id, const absl::Status& why) {
  v1::TokenBatch batch;
  batch.set_request_id(r.id);
  for (size_t j = 0; j < r.images.size(); ++j) {
    Request::Image& im = r.images[j];
    if (r.TransferId(j) != transfer_id || im.state == Request::ImageState::kArrived ||
        im.state == Request::ImageState::kLost) {
      continue;
    }
    im.state = Request::ImageState::kLost;
    batch.add_lost_images(static_cast<uint32_t>(j));
  }
  // Cancelling an unknown or finished transfer is harmless.
  transfer_.Cancel(transfer_id, std::string(why.message()));
  if (batch.lost_images_size() == 0) return;
  lost_images_->Increment(batch.lost_images_size());
  batch.set_lost_reason(std::string(why.message()));
  batch.set_lost_transfer_id(transfer_id);
  LOG(WARNING) << "request " << r.id << ": lost " << batch.lost_images_size() << " image(s) from "
               << transfer_id << ": " << why;
  if (!r.lost_deadline) r.lost_deadline = Deadline::After(options_.lost_image_timeout);
  r.sink.on_batch(std::move(batch));
}

void LanguageCore::MaybeAdmit(Request& r) {
  for (const auto& im : r.images) {
    if (im.state != Request::ImageState::kArrived) return;
  }
  r.multimodal_ms = r.images.empty() ? 0 : r.since_submit.ElapsedSeconds() * 1e3;
  for (auto& im : r.images) r.engine_request.image_embeddings.push_back(std::move(im.embedding));
  const std::string id = r.id;
  absl::Status s = engine_->AddRequest(std::move(r.engine_request),
                                       [this](const worker::StreamEvent& e) { OnEvent(e); });
  if (!s.ok()) {
    End(id, s);
    return;
  }
  r.in_engine = true;
  r.admitted_at_s = r.since_submit.ElapsedSeconds();
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
    End(r.id, absl::DeadlineExceededError("the prefill instance did not commit the KV in time"));
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
    absl::Status s = HandOff(r, e.kv_blocks);
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

absl::Status LanguageCore::HandOff(Request& r, const std::vector<int32_t>& blocks) {
  const Deadline deadline = Deadline::After(options_.kv_handoff_timeout);
  const auto grpc_deadline =
      std::chrono::system_clock::now() + absl::ToChronoNanoseconds(options_.kv_handoff_timeout);
  auto& stub = decode_stubs_[r.decode.address()];
  if (stub == nullptr) stub = v1::Language::NewStub(InternalChannel(r.decode.address()));
  const std::vector<int32_t>& ids = r.prompt_ids;
  v1::KvAllocateRequest req;
  req.set_request_id(r.id);
  req.set_num_tokens(static_cast<uint32_t>(ids.size()));
  req.set_max_new_tokens(static_cast<uint32_t>(r.engine_request.sampling.max_tokens));
  for (int32_t t : ids) req.add_prompt_token_ids(static_cast<uint32_t>(t));
  req.set_seed(r.engine_request.sampling.seed);
  v1::KvAllocation alloc;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(grpc_deadline);
    RETURN_IF_ERROR(FromGrpcStatus(stub->AllocateKv(&ctx, req, &alloc)));
  }
  if (alloc.ranks_size() != 1) {
    return absl::UnimplementedError("the decode instance has several ranks (not yet handed to)");
  }
  const v1::KvRankTarget& rank = alloc.ranks(0);
  transfer::KvHandoffTarget target;
  target.worker_address = rank.peer().worker_address();
  target.rkey = rank.kv_region().rkey();
  target.base_address = rank.kv_region().base_address();
  target.shape.num_layers = rank.layout().num_layers();
  target.shape.num_blocks = rank.layout().num_blocks();
  target.shape.block_size = rank.layout().block_size();
  target.shape.num_kv_heads = rank.layout().num_kv_heads();
  target.shape.head_dim = rank.layout().head_dim();
  const size_t skip = alloc.num_cached_tokens() / std::max<int64_t>(1, target.shape.block_size);
  if (skip > blocks.size() || blocks.size() - skip != static_cast<size_t>(rank.block_ids_size())) {
    return absl::InternalError(absl::StrCat("the decode instance allocated ", rank.block_ids_size(),
                                            " blocks after ", skip, " cached for a prompt of ",
                                            blocks.size()));
  }
  std::vector<int32_t> src(blocks.begin() + skip, blocks.end());
  std::vector<int32_t> dst(rank.block_ids().begin(), rank.block_ids().end());
  ASSIGN_OR_RETURN(uint32_t crc, kv_sender_->Send(target, src, dst, deadline));
  v1::KvCommit commit;
  commit.set_request_id(r.id);
  *commit.mutable_prompt_token_ids() = req.prompt_token_ids();
  commit.set_first_token_id(static_cast<uint32_t>(r.last_token));
  commit.add_rank_crc32c(crc);
  commit.set_seed(r.engine_request.sampling.seed);
  v1::KvCommitAck ack;
  grpc::ClientContext ctx;
  ctx.set_deadline(grpc_deadline);
  RETURN_IF_ERROR(FromGrpcStatus(stub->CommitKv(&ctx, commit, &ack)));
  if (!ack.accepted()) return absl::AbortedError(absl::StrCat("KvCommit refused: ", ack.error()));
  return absl::OkStatus();
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
    if (engine_->has_unfinished()) {
      Stopwatch clock;
      absl::Status s = engine_->Step();
      step_seconds_->Observe(clock.ElapsedSeconds());
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
