// GenerateCall against in-process fake encoder and language instances:
// the colocated and the disaggregated lifecycle, the held early decode
// batches, a first token that is also the last, lost instances, encoder
// failures and rejected requests. The fakes are scripted per test; the
// router side is the real InstanceTable and GenerateCall.
#include "router/generate_call.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/grpc_server.h"
#include "common/metrics.h"
#include "model/chat_template.h"
#include "proto/encoder.grpc.pb.h"
#include "proto/language.grpc.pb.h"

namespace mmserve::router {
namespace {

using internal::v1::DecodeRequest;
using internal::v1::PrefillRequest;
using internal::v1::TokenBatch;
using Writer = grpc::ServerWriter<TokenBatch>;

// Waits up to 10 s for `done`.
bool WaitFor(const std::function<bool()>& done) {
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TokenBatch Tokens(uint32_t id, const std::string& text) {
  TokenBatch b;
  b.add_token_ids(id);
  b.set_text(text);
  return b;
}

TokenBatch Final(uint32_t id, const std::string& text) {
  TokenBatch b = Tokens(id, text);
  b.set_finish_reason(mmserve::v1::FINISH_REASON_LENGTH);
  b.mutable_usage()->set_completion_tokens(3);
  return b;
}

class FakeLanguage final : public internal::v1::Language::Service {
 public:
  using Script = std::function<grpc::Status(grpc::ServerContext*, Writer*)>;
  explicit FakeLanguage(std::string id) : id_(std::move(id)) {}

  Script prefill, decode;
  std::atomic<int> prefills{0}, decodes{0}, retries{0};
  absl::Mutex mu;
  PrefillRequest last_prefill ABSL_GUARDED_BY(mu);

  grpc::Status Prefill(grpc::ServerContext* ctx, const PrefillRequest* request,
                       Writer* writer) override {
    {
      absl::MutexLock lock(&mu);
      last_prefill = *request;
    }
    ++prefills;
    return prefill(ctx, writer);
  }
  grpc::Status Decode(grpc::ServerContext* ctx, const DecodeRequest*, Writer* writer) override {
    ++decodes;
    return decode(ctx, writer);
  }
  grpc::Status RetryImages(grpc::ServerContext*, const internal::v1::ImageRetry*,
                           internal::v1::ImageRetryAck* ack) override {
    ++retries;
    ack->set_accepted(true);
    return grpc::Status::OK;
  }
  grpc::Status GetLoad(grpc::ServerContext*, const internal::v1::LoadRequest*,
                       internal::v1::LoadReport* load) override {
    load->set_instance_id(id_);
    load->set_accepting(true);
    return grpc::Status::OK;
  }

 private:
  const std::string id_;
};

// Encode answers OK with a cache hit, except that the first `fail_first`
// calls over all encoders sharing `calls` fail with UNAVAILABLE.
class FakeEncoder final : public internal::v1::Encoder::Service {
 public:
  FakeEncoder(std::string id, std::atomic<int>* calls, int fail_first)
      : id_(std::move(id)), calls_(calls), fail_first_(fail_first) {}
  std::atomic<int> encodes{0};

  grpc::Status Encode(grpc::ServerContext*, const internal::v1::EncodeRequest* request,
                      internal::v1::EncodeResponse* response) override {
    ++encodes;
    if (calls_->fetch_add(1) < fail_first_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "encoder broke");
    }
    for (int i = 0; i < request->images_size(); ++i) response->add_images()->set_cache_hit(true);
    return grpc::Status::OK;
  }
  grpc::Status GetLoad(grpc::ServerContext*, const internal::v1::LoadRequest*,
                       internal::v1::LoadReport* load) override {
    load->set_instance_id(id_);
    load->set_accepting(true);
    return grpc::Status::OK;
  }

 private:
  const std::string id_;
  std::atomic<int>* calls_;
  const int fail_first_;
};

// A router's context over fake instances, each on its own server.
class Cluster {
 public:
  Cluster() : table_({.poll_interval = absl::Milliseconds(20)}) {
    context_.options.model_id = "m";
    context_.options.presize = false;
    context_.options.config.vision.emplace();
    context_.options.config.text.vocab_size = 1000;
    context_.instances = &table_;
    context_.metrics = &metrics_;
  }
  ~Cluster() {
    table_.Stop();
    for (auto& s : servers_) s->Shutdown(absl::ZeroDuration());
  }

  void Add(const std::string& id, internal::v1::InstanceRole role, grpc::Service* service) {
    auto server = StartGrpcServer("127.0.0.1:0", {service});
    REQUIRE(server.ok());
    internal::v1::InstanceInfo info;
    info.set_instance_id(id);
    info.set_role(role);
    info.set_grpc_address(absl::StrCat("127.0.0.1:", (*server)->port()));
    table_.Upsert(info);
    servers_.push_back(*std::move(server));
    ++instances_;
  }
  // Starts polling; returns once every instance is healthy.
  void Start() {
    table_.Start();
    REQUIRE(WaitFor([&] {
      size_t healthy = 0;
      for (Role r : {Role::kEncoder, Role::kLanguage, Role::kPrefill, Role::kDecode}) {
        healthy += table_.Healthy(r).size();
      }
      return healthy == instances_;
    }));
  }
  const RouterContext& context() const { return context_; }

 private:
  InstanceTable table_;
  metrics::Registry metrics_;
  RouterContext context_;
  std::vector<std::unique_ptr<GrpcServer>> servers_;
  size_t instances_ = 0;
};

// What a call delivered to its sink.
struct Outcome {
  absl::Mutex mu;
  std::vector<mmserve::v1::GenerateResponse> responses ABSL_GUARDED_BY(mu);
  absl::Status status ABSL_GUARDED_BY(mu);
  absl::Notification ended;

  CallSink Sink() {
    return {.on_response =
                [this](mmserve::v1::GenerateResponse r) {
                  absl::MutexLock lock(&mu);
                  CHECK_FALSE(ended.HasBeenNotified());
                  responses.push_back(std::move(r));
                },
            .on_end =
                [this](absl::Status s) {
                  {
                    absl::MutexLock lock(&mu);
                    status = std::move(s);
                  }
                  ended.Notify();
                }};
  }
  std::string Text() {
    absl::MutexLock lock(&mu);
    std::string out;
    for (const auto& r : responses) out += r.text();
    return out;
  }
};

// One image, text around it.
mmserve::v1::GenerateRequest ImageRequest() {
  mmserve::v1::GenerateRequest r;
  r.mutable_raw()->set_text(absl::StrCat("look ", model::kQwen2VlImagePlaceholder, " here"));
  r.mutable_raw()->add_images()->set_data("image bytes");
  return r;
}

std::shared_ptr<GenerateCall> Run(const Cluster& cluster, Outcome& outcome,
                                  mmserve::v1::GenerateRequest request = ImageRequest()) {
  auto call = GenerateCall::Start(cluster.context(), std::move(request), outcome.Sink(),
                                  std::chrono::system_clock::now() + std::chrono::seconds(30));
  REQUIRE(outcome.ended.WaitForNotificationWithTimeout(absl::Seconds(20)));
  return call;
}

// Writes `batches` in order.
FakeLanguage::Script Writes(std::vector<TokenBatch> batches) {
  return [batches](grpc::ServerContext*, Writer* w) {
    for (const auto& b : batches) w->Write(b);
    return grpc::Status::OK;
  };
}

// Writes the decode instance's empty first batch, then waits for the
// router to cancel the stream.
grpc::Status RegisterUntilCancelled(grpc::ServerContext* ctx, Writer* w,
                                    std::atomic<bool>* cancelled) {
  w->Write(TokenBatch());
  WaitFor([&] { return ctx->IsCancelled(); });
  *cancelled = ctx->IsCancelled();
  return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
}

TEST_CASE("a colocated call relays every batch in order and holds the final one for usage") {
  Cluster cluster;
  std::atomic<int> encodes{0};
  FakeEncoder encoder("e0", &encodes, 0);
  FakeLanguage language("l0");
  language.prefill = Writes({Tokens(1, "a"), Tokens(2, "b"), Final(3, "c")});
  cluster.Add("e0", internal::v1::INSTANCE_ROLE_ENCODER, &encoder);
  cluster.Add("l0", internal::v1::INSTANCE_ROLE_BOTH, &language);
  cluster.Start();
  Outcome outcome;
  Run(cluster, outcome);
  absl::MutexLock lock(&outcome.mu);
  CHECK(outcome.status.ok());
  REQUIRE(outcome.responses.size() == 3);
  CHECK(outcome.responses[0].text() == "a");
  CHECK(outcome.responses[1].text() == "b");
  const auto& last = outcome.responses[2];
  CHECK(last.finish_reason() == mmserve::v1::FINISH_REASON_LENGTH);
  CHECK(last.usage().cached_images() == 1);
  CHECK(encoder.encodes == 1);
  absl::MutexLock prefill_lock(&language.mu);
  // The language side gets the image's source, never its bytes.
  REQUIRE(language.last_prefill.images_size() == 1);
  CHECK(language.last_prefill.images(0).encoder_id() == "e0");
  CHECK(language.last_prefill.raw().images(0).data().empty());
  CHECK_FALSE(language.last_prefill.has_decode());
}

// A prefill instance and a decode instance.
struct Disaggregated {
  std::atomic<int> encode_calls{0};
  FakeEncoder encoder{"e0", &encode_calls, 0};
  FakeLanguage prefill{"p0"};
  FakeLanguage decode{"d0"};

  void AddTo(Cluster& cluster) {
    cluster.Add("e0", internal::v1::INSTANCE_ROLE_ENCODER, &encoder);
    cluster.Add("p0", internal::v1::INSTANCE_ROLE_PREFILL, &prefill);
    cluster.Add("d0", internal::v1::INSTANCE_ROLE_DECODE, &decode);
    cluster.Start();
  }
};

TEST_CASE(
    "a disaggregated call registers on the decode instance first and relays decode batches "
    "that beat the hand-off after it") {
  Cluster cluster;
  Disaggregated pd;
  absl::Notification decode_done;
  pd.decode.decode = [&](grpc::ServerContext*, Writer* w) {
    w->Write(TokenBatch());  // the request is held
    // The rest, and the OK close, before the prefill's hand-off batch.
    WaitFor([&] { return pd.prefill.prefills.load() == 1; });
    w->Write(Tokens(2, "b"));
    w->Write(Final(3, "c"));
    decode_done.Notify();
    return grpc::Status::OK;
  };
  pd.prefill.prefill = [&](grpc::ServerContext*, Writer* w) {
    CHECK(pd.decode.decodes == 1);
    decode_done.WaitForNotification();
    TokenBatch handoff = Tokens(1, "a");
    handoff.set_kv_handed_off(true);
    w->Write(handoff);
    return grpc::Status::OK;
  };
  pd.AddTo(cluster);
  Outcome outcome;
  Run(cluster, outcome);
  CHECK(outcome.Text() == "abc");
  absl::MutexLock lock(&outcome.mu);
  CHECK(outcome.status.ok());
  REQUIRE(outcome.responses.size() == 3);
  CHECK(outcome.responses[2].finish_reason() == mmserve::v1::FINISH_REASON_LENGTH);
  CHECK(outcome.responses[2].usage().cached_images() == 1);
  absl::MutexLock prefill_lock(&pd.prefill.mu);
  CHECK(pd.prefill.last_prefill.decode().instance_id() == "d0");
}

TEST_CASE("a first token that is also the last ends the call and cancels the decode registration") {
  Cluster cluster;
  Disaggregated pd;
  std::atomic<bool> cancelled{false};
  pd.decode.decode = [&](grpc::ServerContext* ctx, Writer* w) {
    return RegisterUntilCancelled(ctx, w, &cancelled);
  };
  pd.prefill.prefill = Writes({Final(1, "a")});
  pd.AddTo(cluster);
  Outcome outcome;
  Run(cluster, outcome);
  {
    absl::MutexLock lock(&outcome.mu);
    CHECK(outcome.status.ok());
    REQUIRE(outcome.responses.size() == 1);
    CHECK(outcome.responses[0].finish_reason() == mmserve::v1::FINISH_REASON_LENGTH);
  }
  CHECK(WaitFor([&] { return cancelled.load(); }));
}

TEST_CASE("a decode instance that fails ends the call with UNAVAILABLE naming the decode side") {
  Cluster cluster;
  Disaggregated pd;
  std::atomic<bool> prefill_cancelled{false};
  pd.decode.decode = [&](grpc::ServerContext*, Writer* w) {
    w->Write(TokenBatch());
    WaitFor([&] { return pd.prefill.prefills.load() == 1; });
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode broke");
  };
  pd.prefill.prefill = [&](grpc::ServerContext* ctx, Writer*) {
    WaitFor([&] { return ctx->IsCancelled(); });
    prefill_cancelled = ctx->IsCancelled();
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  };
  pd.AddTo(cluster);
  Outcome outcome;
  Run(cluster, outcome);
  {
    absl::MutexLock lock(&outcome.mu);
    INFO(outcome.status);
    CHECK(outcome.status.code() == absl::StatusCode::kUnavailable);
    CHECK(outcome.status.message().find("decode instance d0 failed") != std::string::npos);
  }
  CHECK(WaitFor([&] { return prefill_cancelled.load(); }));
}

TEST_CASE(
    "an encoder that fails before the decode instance holds the request: the prefill starts "
    "with the image's new source") {
  Cluster cluster;
  std::atomic<int> encode_calls{0};
  FakeEncoder e0("e0", &encode_calls, 1), e1("e1", &encode_calls, 1);
  FakeLanguage prefill("p0"), decode("d0");
  std::atomic<bool> cancelled{false};
  decode.decode = [&](grpc::ServerContext* ctx, Writer* w) {
    // Holds the registration back until the image has moved.
    WaitFor([&] { return encode_calls.load() == 2; });
    return RegisterUntilCancelled(ctx, w, &cancelled);
  };
  prefill.prefill = Writes({Final(1, "a")});
  cluster.Add("e0", internal::v1::INSTANCE_ROLE_ENCODER, &e0);
  cluster.Add("e1", internal::v1::INSTANCE_ROLE_ENCODER, &e1);
  cluster.Add("p0", internal::v1::INSTANCE_ROLE_PREFILL, &prefill);
  cluster.Add("d0", internal::v1::INSTANCE_ROLE_DECODE, &decode);
  cluster.Start();
  Outcome outcome;
  Run(cluster, outcome);
  {
    absl::MutexLock lock(&outcome.mu);
    CHECK(outcome.status.ok());
  }
  CHECK(e0.encodes == 1);
  CHECK(e1.encodes == 1);
  CHECK(prefill.retries == 0);
  absl::MutexLock lock(&prefill.mu);
  REQUIRE(prefill.last_prefill.images_size() == 1);
  const internal::v1::PromptImage& image = prefill.last_prefill.images(0);
  // The transfer id names the second attempt.
  CHECK(image.transfer_id() ==
        absl::StrCat(prefill.last_prefill.request_id(), "@", image.encoder_id(), "#2"));
}

TEST_CASE("an encoder that fails while prefilling moves the image and tells the language side") {
  Cluster cluster;
  std::atomic<int> encode_calls{0};
  FakeEncoder e0("e0", &encode_calls, 1), e1("e1", &encode_calls, 1);
  FakeLanguage language("l0");
  language.prefill = [&](grpc::ServerContext*, Writer* w) {
    WaitFor([&] { return language.retries.load() == 1; });
    w->Write(Final(1, "a"));
    return grpc::Status::OK;
  };
  cluster.Add("e0", internal::v1::INSTANCE_ROLE_ENCODER, &e0);
  cluster.Add("e1", internal::v1::INSTANCE_ROLE_ENCODER, &e1);
  cluster.Add("l0", internal::v1::INSTANCE_ROLE_BOTH, &language);
  cluster.Start();
  Outcome outcome;
  Run(cluster, outcome);
  absl::MutexLock lock(&outcome.mu);
  CHECK(outcome.status.ok());
  CHECK(e0.encodes == 1);
  CHECK(e1.encodes == 1);
  CHECK(language.retries == 1);
}

TEST_CASE("a bad request ends with INVALID_ARGUMENT before any backend is called") {
  Cluster cluster;
  std::atomic<int> encode_calls{0};
  FakeEncoder encoder("e0", &encode_calls, 0);
  FakeLanguage language("l0");
  cluster.Add("e0", internal::v1::INSTANCE_ROLE_ENCODER, &encoder);
  cluster.Add("l0", internal::v1::INSTANCE_ROLE_BOTH, &language);
  cluster.Start();
  mmserve::v1::GenerateRequest bad = ImageRequest();
  bad.mutable_raw()->set_text("no placeholder");
  Outcome outcome;
  Run(cluster, outcome, bad);
  absl::MutexLock lock(&outcome.mu);
  CHECK(outcome.status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(outcome.responses.empty());
  CHECK(encoder.encodes == 0);
  CHECK(language.prefills == 0);
}

TEST_CASE("without a language instance the call ends with UNAVAILABLE at once") {
  Cluster cluster;
  std::atomic<int> encode_calls{0};
  FakeEncoder encoder("e0", &encode_calls, 0);
  FakeLanguage prefill("p0");  // prefill without decode is no arrangement
  cluster.Add("e0", internal::v1::INSTANCE_ROLE_ENCODER, &encoder);
  cluster.Add("p0", internal::v1::INSTANCE_ROLE_PREFILL, &prefill);
  cluster.Start();
  Outcome outcome;
  Run(cluster, outcome);
  absl::MutexLock lock(&outcome.mu);
  CHECK(outcome.status.code() == absl::StatusCode::kUnavailable);
  CHECK(encoder.encodes == 0);
}

TEST_CASE("a cancel ends the call with CANCELLED and cancels the prefill stream") {
  Cluster cluster;
  std::atomic<int> encode_calls{0};
  FakeEncoder encoder("e0", &encode_calls, 0);
  FakeLanguage language("l0");
  std::atomic<bool> cancelled{false};
  language.prefill = [&](grpc::ServerContext* ctx, Writer* w) {
    w->Write(Tokens(1, "a"));
    WaitFor([&] { return ctx->IsCancelled(); });
    cancelled = ctx->IsCancelled();
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  };
  cluster.Add("e0", internal::v1::INSTANCE_ROLE_ENCODER, &encoder);
  cluster.Add("l0", internal::v1::INSTANCE_ROLE_BOTH, &language);
  cluster.Start();
  Outcome outcome;
  auto call = GenerateCall::Start(cluster.context(), ImageRequest(), outcome.Sink(),
                                  std::chrono::system_clock::now() + std::chrono::seconds(30));
  REQUIRE(WaitFor([&] { return !outcome.Text().empty(); }));
  call->Cancel("client went away");
  REQUIRE(outcome.ended.WaitForNotificationWithTimeout(absl::Seconds(20)));
  {
    absl::MutexLock lock(&outcome.mu);
    CHECK(outcome.status.code() == absl::StatusCode::kCancelled);
  }
  CHECK(WaitFor([&] { return cancelled.load(); }));
}

}  // namespace
}  // namespace mmserve::router
