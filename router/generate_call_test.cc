// GenerateCall against in-process fake encoder and language instances:
// the colocated and the disaggregated lifecycle, the held early decode
// batches, a first token that is also the last, lost instances, encoder
// failures, image copies (an elastic group's other members), migration off a
// lost role-both instance (images copied for the new one) and rejected
// requests. The fakes are scripted per test; the
// router side is the real InstanceTable and GenerateCall.
#include "router/generate_call.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/event_loop.h"
#include "common/grpc_server.h"
#include "common/metrics.h"
#include "model/chat_template.h"
#include "proto/encoder.grpc.pb.h"
#include "proto/language.grpc.pb.h"
#include "router/call_testing.h"
#include "router/deferred_actions.h"
#include "router/encoder_dispatch.h"
#include "router/public_error.h"

namespace mmserve::router {
namespace {

using internal::v1::DecodeRequest;
using internal::v1::PrefillRequest;
using internal::v1::TokenBatch;
using Writer = grpc::ServerWriter<TokenBatch>;

class FakeLanguage final : public Healthy<internal::v1::Language::Service> {
 public:
  using Script = std::function<grpc::Status(grpc::ServerContext*, Writer*)>;
  explicit FakeLanguage(std::string id) : Healthy(std::move(id)) {}

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
};

// Encode answers OK with a cache hit, except that the first `fail_first`
// calls over all encoders sharing `calls` fail with UNAVAILABLE.
class FakeEncoder final : public Healthy<internal::v1::Encoder::Service> {
 public:
  FakeEncoder(std::string id, std::atomic<int>* calls, int fail_first)
      : Healthy(std::move(id)), calls_(calls), fail_first_(fail_first) {}
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

 private:
  std::atomic<int>* calls_;
  const int fail_first_;
};

// A router's context over fake instances, each on its own server: two
// encoders (each fails the first `failing_encodes` Encode calls between
// them), a role-both instance, a prefill and a decode instance. Start
// registers those a test names.
class Stack {
 public:
  explicit Stack(int failing_encodes = 0)
      : e0("e0", &encode_calls_, failing_encodes),
        e1("e1", &encode_calls_, failing_encodes),
        table_({.poll_interval = absl::Milliseconds(20)}) {
    context_.options.model_id = "m";
    context_.options.presize = false;
    context_.options.config.vision.emplace();
    context_.options.config.text.vocab_size = 1000;
    context_.instances = &table_;
    context_.metrics = &call_metrics_;
  }
  ~Stack() {
    table_.Stop();
    for (auto& s : servers_) s->Shutdown(absl::ZeroDuration());
  }

  // Registers the named instances; returns once they are healthy.
  void Start(const std::vector<std::string>& ids) {
    for (const std::string& id : ids) {
      if (id == "e0") Add(id, internal::v1::INSTANCE_ROLE_ENCODER, &e0);
      if (id == "e1") Add(id, internal::v1::INSTANCE_ROLE_ENCODER, &e1);
      if (id == "l0") Add(id, internal::v1::INSTANCE_ROLE_BOTH, &both);
      if (id == "l1") Add(id, internal::v1::INSTANCE_ROLE_BOTH, &both1);
      if (id == "p0") Add(id, internal::v1::INSTANCE_ROLE_PREFILL, &prefill);
      if (id == "d0") Add(id, internal::v1::INSTANCE_ROLE_DECODE, &decode);
    }
    table_.Start(loop_);
    REQUIRE(WaitFor([&] {
      size_t healthy = 0;
      for (Role r : {Role::kEncoder, Role::kLanguage, Role::kPrefill, Role::kDecode}) {
        healthy += table_.Healthy(r).size();
      }
      return healthy == ids.size();
    }));
  }
  const RouterContext& context() const { return context_; }
  void set_migration_limit(int n) { context_.options.migration_limit = n; }
  double migrations(const std::string& outcome) const {
    if (outcome == "resumed") return call_metrics_.migrations_resumed.value();
    if (outcome == "over_limit") return call_metrics_.migrations_over_limit.value();
    return call_metrics_.migrations_no_instance.value();
  }
  int encode_calls() const { return encode_calls_.load(); }
  const CallMetrics& metrics() const { return call_metrics_; }

 private:
  std::atomic<int> encode_calls_{0};

 public:
  FakeEncoder e0, e1;
  FakeLanguage both{"l0"}, both1{"l1"}, prefill{"p0"}, decode{"d0"};

 private:
  void Add(const std::string& id, internal::v1::InstanceRole role, grpc::Service* service) {
    auto server = StartGrpcServer("127.0.0.1:0", {service});
    REQUIRE(server.ok());
    internal::v1::InstanceInfo info;
    info.set_instance_id(id);
    info.set_role(role);
    info.set_grpc_address(absl::StrCat("127.0.0.1:", (*server)->port()));
    table_.Upsert(info);
    servers_.push_back(*std::move(server));
  }

  EventLoop loop_{{.name = "router"}};
  InstanceTable table_;
  metrics::Registry metrics_;
  CallMetrics call_metrics_{metrics_};
  RouterContext context_;
  std::vector<std::unique_ptr<GrpcServer>> servers_;
};

// One image, text around it.
mmserve::v1::GenerateRequest ImageRequest() {
  mmserve::v1::GenerateRequest r;
  r.mutable_raw()->set_text(absl::StrCat("look ", model::kQwen2VlImagePlaceholder, " here"));
  r.mutable_raw()->add_images()->set_data("image bytes");
  return r;
}

std::shared_ptr<GenerateCall> Start(const Stack& stack, Outcome& outcome,
                                    mmserve::v1::GenerateRequest request = ImageRequest()) {
  return GenerateCall::Start(stack.context(), std::move(request), outcome.Sink(),
                             std::chrono::system_clock::now() + std::chrono::seconds(30));
}

// Runs a call to its end.
void Run(const Stack& stack, Outcome& outcome,
         mmserve::v1::GenerateRequest request = ImageRequest()) {
  Start(stack, outcome, std::move(request));
  REQUIRE(outcome.WaitForEnd());
}

// The prefill request `language` received.
PrefillRequest LastPrefill(FakeLanguage& language) {
  absl::MutexLock lock(&language.mu);
  return language.last_prefill;
}

// Writes `batches` in order.
FakeLanguage::Script Writes(std::vector<TokenBatch> batches) {
  return [batches](grpc::ServerContext*, Writer* w) {
    for (const auto& b : batches) w->Write(b);
    return grpc::Status::OK;
  };
}

// Writes `first` (if any), then waits for the router to cancel the stream.
FakeLanguage::Script UntilCancelled(
    std::optional<TokenBatch> first, std::atomic<bool>* cancelled,
    std::function<void()> before = [] {}) {
  return [=](grpc::ServerContext* ctx, Writer* w) {
    before();
    if (first) w->Write(*first);
    WaitFor([&] { return ctx->IsCancelled(); });
    *cancelled = ctx->IsCancelled();
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  };
}

TEST_CASE("a colocated call relays every batch in order and holds the final one for usage") {
  Stack stack;
  stack.both.prefill = Writes({Tokens(1, "a"), Tokens(2, "b"), Final(3, "c")});
  stack.Start({"e0", "l0"});
  Outcome outcome;
  Run(stack, outcome);
  CHECK(outcome.status().ok());
  const auto responses = outcome.responses();
  REQUIRE(responses.size() == 3);
  CHECK(responses[0].text() == "a");
  CHECK(responses[1].text() == "b");
  CHECK(responses[2].finish_reason() == mmserve::v1::FINISH_REASON_LENGTH);
  CHECK(responses[2].usage().cached_images() == 1);
  CHECK(stack.e0.encodes == 1);
  // The language side gets the image's source, never its bytes.
  const PrefillRequest prefill = LastPrefill(stack.both);
  REQUIRE(prefill.images_size() == 1);
  CHECK(prefill.images(0).encoder_id() == "e0");
  CHECK(prefill.raw().images(0).data().empty());
  CHECK_FALSE(prefill.has_decode());
}

TEST_CASE(
    "a disaggregated call registers on the decode instance first and relays decode batches "
    "that beat the hand-off after it") {
  Stack stack;
  absl::Notification decode_done;
  stack.decode.decode = [&](grpc::ServerContext*, Writer* w) {
    w->Write(TokenBatch());  // the request is held
    // The rest, and the OK close, before the prefill's hand-off batch.
    WaitFor([&] { return stack.prefill.prefills.load() == 1; });
    w->Write(Tokens(2, "b"));
    w->Write(Final(3, "c"));
    decode_done.Notify();
    return grpc::Status::OK;
  };
  stack.prefill.prefill = [&](grpc::ServerContext*, Writer* w) {
    CHECK(stack.decode.decodes == 1);
    decode_done.WaitForNotification();
    TokenBatch handoff = Tokens(1, "a");
    handoff.set_kv_handed_off(true);
    w->Write(handoff);
    return grpc::Status::OK;
  };
  stack.Start({"e0", "p0", "d0"});
  Outcome outcome;
  Run(stack, outcome);
  CHECK(outcome.status().ok());
  CHECK(outcome.Text() == "abc");
  const auto responses = outcome.responses();
  REQUIRE(responses.size() == 3);
  CHECK(responses[2].finish_reason() == mmserve::v1::FINISH_REASON_LENGTH);
  CHECK(responses[2].usage().cached_images() == 1);
  CHECK(LastPrefill(stack.prefill).decode().instance_id() == "d0");
}

TEST_CASE(
    "a prefill stream that fails while the decode stream is open ends the call UNAVAILABLE; "
    "the decode batches held for after the hand-off never reach the client") {
  Stack stack;
  std::atomic<bool> cancelled{false};
  stack.decode.decode = [&](grpc::ServerContext* ctx, Writer* w) {
    w->Write(TokenBatch());  // the request is held
    WaitFor([&] { return stack.prefill.prefills.load() == 1; });
    w->Write(Tokens(2, "b"));  // early: held until a hand-off that never comes
    WaitFor([&] { return ctx->IsCancelled(); });
    cancelled = ctx->IsCancelled();
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  };
  stack.prefill.prefill = [&](grpc::ServerContext*, Writer* w) {
    w->Write(Tokens(1, "a"));
    absl::SleepFor(absl::Milliseconds(50));  // lets the early decode batch arrive first
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "prefill broke");
  };
  stack.Start({"e0", "p0", "d0"});
  Outcome outcome;
  Run(stack, outcome);
  INFO(outcome.status());
  CHECK(outcome.status().code() == absl::StatusCode::kUnavailable);
  CHECK(outcome.Text() == "a");
  CHECK(WaitFor([&] { return cancelled.load(); }));
}

TEST_CASE("a first token that is also the last ends the call and cancels the decode registration") {
  Stack stack;
  std::atomic<bool> cancelled{false};
  stack.decode.decode = UntilCancelled(TokenBatch(), &cancelled);
  stack.prefill.prefill = Writes({Final(1, "a")});
  stack.Start({"e0", "p0", "d0"});
  Outcome outcome;
  Run(stack, outcome);
  CHECK(outcome.status().ok());
  const auto responses = outcome.responses();
  REQUIRE(responses.size() == 1);
  CHECK(responses[0].finish_reason() == mmserve::v1::FINISH_REASON_LENGTH);
  CHECK(WaitFor([&] { return cancelled.load(); }));
}

TEST_CASE(
    "a decode instance that fails ends the call with UNAVAILABLE, a generic message and the "
    "request id") {
  Stack stack;
  std::atomic<bool> cancelled{false};
  stack.decode.decode = [&](grpc::ServerContext*, Writer* w) {
    w->Write(TokenBatch());
    WaitFor([&] { return stack.prefill.prefills.load() == 1; });
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode broke");
  };
  stack.prefill.prefill = UntilCancelled(std::nullopt, &cancelled);
  stack.Start({"e0", "p0", "d0"});
  Outcome outcome;
  Run(stack, outcome);
  const absl::Status status = outcome.status();
  INFO(status);
  CHECK(status.code() == absl::StatusCode::kUnavailable);
  // The instance and its error stay in the router's log.
  CHECK(status.message().find("d0") == std::string::npos);
  CHECK(status.message().find("decode broke") == std::string::npos);
  CHECK(status.message() ==
        "the model backend failed; retry (request id " + RequestIdOf(status) + ")");
  CHECK(!RequestIdOf(status).empty());
  CHECK(WaitFor([&] { return cancelled.load(); }));
}

TEST_CASE(
    "an encoder that fails before the decode instance holds the request: the prefill starts "
    "with the image's new source") {
  Stack stack(/*failing_encodes=*/1);
  std::atomic<bool> cancelled{false};
  // Holds the registration back until the image has moved.
  stack.decode.decode = UntilCancelled(TokenBatch(), &cancelled,
                                       [&] { WaitFor([&] { return stack.encode_calls() == 2; }); });
  stack.prefill.prefill = Writes({Final(1, "a")});
  stack.Start({"e0", "e1", "p0", "d0"});
  Outcome outcome;
  Run(stack, outcome);
  CHECK(outcome.status().ok());
  CHECK(stack.e0.encodes == 1);
  CHECK(stack.e1.encodes == 1);
  CHECK(stack.prefill.retries == 0);
  const PrefillRequest prefill = LastPrefill(stack.prefill);
  REQUIRE(prefill.images_size() == 1);
  const internal::v1::PromptImage& image = prefill.images(0);
  // The transfer id names the second attempt.
  CHECK(image.transfer_id() == absl::StrCat(prefill.request_id(), "@", image.encoder_id(), "#2"));
}

TEST_CASE("an encoder that fails while prefilling moves the image and tells the language side") {
  Stack stack(/*failing_encodes=*/1);
  stack.both.prefill = [&](grpc::ServerContext*, Writer* w) {
    WaitFor([&] { return stack.both.retries.load() == 1; });
    w->Write(Final(1, "a"));
    return grpc::Status::OK;
  };
  stack.Start({"e0", "e1", "l0"});
  Outcome outcome;
  Run(stack, outcome);
  CHECK(outcome.status().ok());
  CHECK(stack.e0.encodes == 1);
  CHECK(stack.e1.encodes == 1);
  CHECK(stack.both.retries == 1);
}

// An elastic group's members past the first (call_streams.cc): a transfer has
// one receiver, so each gets its own copy of the images.
TEST_CASE("an image copy is a new Encode call and transfer id on the image's encoder") {
  Stack stack(/*failing_encodes=*/0);
  stack.Start({"e0", "e1"});
  const mmserve::v1::GenerateRequest request = ImageRequest();
  EncoderDispatch dispatch(stack.context(), request,
                           std::chrono::system_clock::now() + std::chrono::seconds(20),
                           {PreparedMedia{.hash = {1, 2}}});
  DeferredActions deferred;
  absl::Mutex mu;
  std::vector<EncodeFailure> answers;
  const EncoderDispatch::OnEncoded on_encoded = [&](EncoderDispatch::Encode* e,
                                                    const grpc::Status& s) {
    absl::MutexLock lock(&mu);
    answers.push_back(dispatch.Answered(e, s));
  };
  auto first = dispatch.Dispatch({0}, deferred, on_encoded);
  REQUIRE(first.ok());
  auto copy = dispatch.DispatchCopy({0}, deferred, on_encoded);
  REQUIRE(copy.ok());
  deferred.Run();
  REQUIRE(first->size() == 1);
  REQUIRE(copy->size() == 1);
  CHECK((*copy)[0].transfer_id() != (*first)[0].transfer_id());
  CHECK((*copy)[0].encoder_id() == (*first)[0].encoder_id());
  CHECK((*copy)[0].image_index() == 0);
  REQUIRE(WaitFor([&] {
    absl::MutexLock lock(&mu);
    return answers.size() == 2;
  }));
  absl::MutexLock lock(&mu);
  CHECK(dispatch.AllAnswered());
  // Both were cache hits; the copy's is not counted.
  CHECK(dispatch.cached_images() == 1);
  CHECK(stack.e0.encodes + stack.e1.encodes == 2);
  // The image's source is still the first's: a report on it is not stale.
  CHECK(dispatch.ImagesOn((*first)[0].encoder_id()) == std::vector<size_t>{0});
}

// A repeat turn on the instance that holds its image (generate_call.cc): the
// image goes to no encoder until the language side reports it lost.
TEST_CASE("an image expected cached goes to no encoder until it is lost, then to one") {
  Stack stack(/*failing_encodes=*/0);
  stack.Start({"e0"});
  const mmserve::v1::GenerateRequest request = ImageRequest();
  EncoderDispatch dispatch(
      stack.context(), request, std::chrono::system_clock::now() + std::chrono::seconds(20),
      {PreparedMedia{.hash = {1, 2}, .grid = model::MediaGrid::FromThw(1, 4, 4)},
       PreparedMedia{.hash = {3, 4}}});
  DeferredActions deferred;
  absl::Mutex mu;
  int answers = 0;
  const EncoderDispatch::OnEncoded on_encoded = [&](EncoderDispatch::Encode* e,
                                                    const grpc::Status& s) {
    absl::MutexLock lock(&mu);
    dispatch.Answered(e, s);
    ++answers;
  };
  // Not pre-sized: the language side could not place it without rows.
  CHECK_FALSE(dispatch.ExpectCached(1).has_value());
  std::optional<internal::v1::PromptImage> held = dispatch.ExpectCached(0);
  REQUIRE(held.has_value());
  CHECK(held->expect_cached());
  CHECK(held->encoder_id().empty());
  CHECK(held->encoder_address().empty());
  CHECK(held->num_tokens() == 4);
  CHECK(held->grid_h() == 4);
  CHECK_FALSE(held->transfer_id().empty());
  CHECK(dispatch.AllAnswered());
  CHECK(stack.metrics().encoder_skipped.value() == 1);
  // A report about another source is stale; one about it moves it to an encoder.
  TokenBatch stale;
  stale.add_lost_images(0);
  stale.set_lost_transfer_id("something else");
  CHECK(dispatch.Lost(stale).empty());
  TokenBatch lost;
  lost.add_lost_images(0);
  lost.set_lost_transfer_id(held->transfer_id());
  const std::map<std::string, std::vector<size_t>> by_source = dispatch.Lost(lost);
  REQUIRE(by_source.size() == 1);
  CHECK(by_source.begin()->second == std::vector<size_t>{0});
  auto moved =
      dispatch.Move(by_source.begin()->second, by_source.begin()->first, deferred, on_encoded);
  REQUIRE(moved.ok());
  deferred.Run();
  REQUIRE(moved->size() == 1);
  CHECK((*moved)[0].encoder_id() == "e0");
  CHECK_FALSE((*moved)[0].expect_cached());
  CHECK(stack.metrics().encoder_skip_fallbacks.value() == 1);
  REQUIRE(WaitFor([&] {
    absl::MutexLock lock(&mu);
    return answers == 1;
  }));
  CHECK(stack.e0.encodes == 1);
}

TEST_CASE("a copy of an image expected cached is its first dispatch to an encoder") {
  Stack stack(/*failing_encodes=*/0);
  stack.Start({"e0"});
  const mmserve::v1::GenerateRequest request = ImageRequest();
  EncoderDispatch dispatch(
      stack.context(), request, std::chrono::system_clock::now() + std::chrono::seconds(20),
      {PreparedMedia{.hash = {1, 2}, .grid = model::MediaGrid::FromThw(1, 4, 4)}});
  DeferredActions deferred;
  std::atomic<int> answers{0};
  const EncoderDispatch::OnEncoded on_encoded = [&](EncoderDispatch::Encode*, const grpc::Status&) {
    ++answers;
  };
  REQUIRE(dispatch.ExpectCached(0).has_value());
  // A migration's new instance does not hold the image: it gets it encoded.
  auto copy = dispatch.DispatchCopy({0}, deferred, on_encoded);
  REQUIRE(copy.ok());
  deferred.Run();
  REQUIRE(copy->size() == 1);
  CHECK((*copy)[0].encoder_id() == "e0");
  CHECK_FALSE((*copy)[0].expect_cached());
  CHECK(stack.metrics().encoder_skip_fallbacks.value() == 1);
  REQUIRE(WaitFor([&] { return answers.load() == 1; }));
  CHECK(dispatch.ImagesOn("e0") == std::vector<size_t>{0});
}

TEST_CASE("a bad request ends with INVALID_ARGUMENT before any backend is called") {
  Stack stack;
  stack.Start({"e0", "l0"});
  mmserve::v1::GenerateRequest bad = ImageRequest();
  bad.mutable_raw()->set_text("no placeholder");
  Outcome outcome;
  Run(stack, outcome, bad);
  CHECK(outcome.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(outcome.responses().empty());
  CHECK(stack.encode_calls() == 0);
  CHECK(stack.both.prefills == 0);
}

TEST_CASE("without a language arrangement the call ends with UNAVAILABLE at once") {
  Stack stack;
  stack.Start({"e0", "p0"});  // prefill without decode
  Outcome outcome;
  Run(stack, outcome);
  CHECK(outcome.status().code() == absl::StatusCode::kUnavailable);
  CHECK(stack.encode_calls() == 0);
}

TEST_CASE("a cancel ends the call with CANCELLED and cancels the prefill stream") {
  Stack stack;
  std::atomic<bool> cancelled{false};
  stack.both.prefill = UntilCancelled(Tokens(1, "a"), &cancelled);
  stack.Start({"e0", "l0"});
  Outcome outcome;
  auto call = Start(stack, outcome);
  REQUIRE(WaitFor([&] { return !outcome.Text().empty(); }));
  call->Cancel("client went away");
  REQUIRE(outcome.WaitForEnd());
  CHECK(outcome.status().code() == absl::StatusCode::kCancelled);
  CHECK(WaitFor([&] { return cancelled.load(); }));
}

mmserve::v1::GenerateRequest TextRequest() {
  mmserve::v1::GenerateRequest r;
  r.mutable_raw()->set_text("tell me more");
  r.mutable_sampling()->set_temperature(0.7f);
  return r;
}

// A role-both instance: a fresh request gets `lost_after` tokens and then the
// stream fails as a lost instance's does; a resumed one gets the rest.
FakeLanguage::Script LosesFreshStreams(FakeLanguage& language, int lost_after) {
  return [&language, lost_after](grpc::ServerContext*, Writer* w) {
    const PrefillRequest request = LastPrefill(language);
    if (request.resume_output_token_ids_size() > 0) {
      w->Write(Tokens(3, "c"));
      w->Write(Final(4, "d"));
      return grpc::Status::OK;
    }
    for (int i = 1; i <= lost_after; ++i) w->Write(Tokens(i, i == 1 ? "a" : "b"));
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed");
  };
}

TEST_CASE(
    "a colocated stream whose instance is lost resumes on the other instance from the relayed "
    "tokens, with the same seed") {
  Stack stack;
  stack.both.prefill = LosesFreshStreams(stack.both, 2);
  stack.both1.prefill = LosesFreshStreams(stack.both1, 2);
  stack.Start({"l0", "l1"});
  Outcome outcome;
  Run(stack, outcome, TextRequest());
  INFO(outcome.status());
  CHECK(outcome.status().ok());
  CHECK(outcome.Text() == "abcd");
  CHECK(outcome.responses().back().finish_reason() == mmserve::v1::FINISH_REASON_LENGTH);
  REQUIRE(stack.both.prefills == 1);
  REQUIRE(stack.both1.prefills == 1);
  PrefillRequest first = LastPrefill(stack.both), resumed = LastPrefill(stack.both1);
  if (first.resume_output_token_ids_size() > 0) std::swap(first, resumed);
  CHECK(first.resume_output_token_ids_size() == 0);
  CHECK(std::vector<uint32_t>(resumed.resume_output_token_ids().begin(),
                              resumed.resume_output_token_ids().end()) ==
        std::vector<uint32_t>{1, 2});
  // The request sent no seed: the router chose one, the same for both.
  CHECK(first.sampling().has_seed());
  CHECK(resumed.sampling().seed() == first.sampling().seed());
  CHECK(stack.migrations("resumed") == 1);
}

TEST_CASE(
    "a stream lost before its first token moves with no tokens; losing the second instance too "
    "ends the call UNAVAILABLE past the limit") {
  Stack stack;
  stack.both.prefill = LosesFreshStreams(stack.both, 0);
  stack.both1.prefill = LosesFreshStreams(stack.both1, 0);
  stack.Start({"l0", "l1"});
  Outcome outcome;
  Run(stack, outcome, TextRequest());
  INFO(outcome.status());
  // Both instances lose fresh streams: the second one fails too, past the
  // limit of one move.
  CHECK(outcome.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StrContains(outcome.status().message(), "the model backend failed"));
  CHECK(stack.both.prefills + stack.both1.prefills == 2);
  CHECK(stack.migrations("resumed") == 1);
  CHECK(stack.migrations("over_limit") == 1);
}

TEST_CASE("an image request moves with copies of its images for the new instance") {
  Stack stack;
  stack.both.prefill = LosesFreshStreams(stack.both, 2);
  stack.both1.prefill = LosesFreshStreams(stack.both1, 2);
  stack.Start({"e0", "l0", "l1"});
  Outcome outcome;
  Run(stack, outcome, ImageRequest());
  INFO(outcome.status());
  CHECK(outcome.status().ok());
  CHECK(outcome.Text() == "abcd");
  PrefillRequest first = LastPrefill(stack.both), resumed = LastPrefill(stack.both1);
  if (first.resume_output_token_ids_size() > 0) std::swap(first, resumed);
  REQUIRE(first.images_size() == 1);
  REQUIRE(resumed.images_size() == 1);
  CHECK(resumed.images(0).encoder_id() == "e0");
  CHECK(resumed.images(0).transfer_id() != first.images(0).transfer_id());
  CHECK(stack.e0.encodes == 2);  // the image's call and its copy's
}

TEST_CASE("with migration_limit 0 or no other instance, a lost stream ends UNAVAILABLE") {
  for (const char* why : {"limit 0", "one instance"}) {
    INFO(why);
    Stack stack;
    if (std::string(why) == "limit 0") stack.set_migration_limit(0);
    stack.both.prefill = LosesFreshStreams(stack.both, 1);
    stack.both1.prefill = LosesFreshStreams(stack.both1, 1);
    if (std::string(why) == "one instance") {
      stack.Start({"e0", "l0"});
    } else {
      stack.Start({"e0", "l0", "l1"});
    }
    Outcome outcome;
    Run(stack, outcome, TextRequest());
    CHECK(outcome.status().code() == absl::StatusCode::kUnavailable);
    CHECK(outcome.Text() == "a");
    CHECK(stack.both.prefills + stack.both1.prefills == 1);
    CHECK(stack.migrations("resumed") == 0);
  }
}

}  // namespace
}  // namespace mmserve::router
