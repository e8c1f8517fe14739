// GenerateCall and ElasticPool (router --elastic) against in-process fake elastic
// instances (Language ElasticPrefill, Prefill, Abort and GetLoad): degree 1
// when a request fits one instance, a group when it does not, Abort to
// every member on finish, cancel and a member's failure (whose reason wins
// over the others' echoes), refusals at once
// and after the queue wait, the step-time models refitted from the
// pool's own prefills, and a property run: promised slots never exceed an
// instance's capacity and each request has one master.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/event_loop.h"
#include "common/grpc_server.h"
#include "common/metrics.h"
#include "language_service/elastic_plan.h"
#include "proto/language.grpc.pb.h"
#include "router/call_testing.h"
#include "router/elastic_pool.h"
#include "router/elastic_step_models.h"
#include "router/generate_call.h"

namespace mmserve::router {
namespace {

using internal::v1::ElasticPrefillRequest;
using internal::v1::PrefillRequest;
using Writer = grpc::ServerWriter<TokenBatch>;

constexpr int64_t kBlock = 16;

// The sampler writes the first token, the master the rest.
grpc::Status SamplerThenMaster(const ElasticPrefillRequest& r, grpc::ServerContext*, Writer* w) {
  if (r.member() == r.plan().sampler()) w->Write(Tokens(1, "a"));
  if (r.member() == r.plan().master()) {
    w->Write(Tokens(2, "b"));
    w->Write(Final(3, "c"));
  }
  return grpc::Status::OK;
}

// Waits for the router to cancel the call.
grpc::Status UntilCancelled(grpc::ServerContext* ctx) {
  WaitFor([&] { return ctx->IsCancelled(); });
  return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
}

class FakeElastic final : public Healthy<internal::v1::Language::Service> {
 public:
  using ElasticScript =
      std::function<grpc::Status(const ElasticPrefillRequest&, grpc::ServerContext*, Writer*)>;
  using Script = std::function<grpc::Status(grpc::ServerContext*, Writer*)>;

  FakeElastic(std::string id, int64_t slots) : Healthy(id), id_(std::move(id)), slots(slots) {}

  const std::string id_;
  std::atomic<int64_t> slots;  // reported free
  ElasticScript elastic = SamplerThenMaster;
  Script prefill = [](grpc::ServerContext*, Writer* w) {
    w->Write(Tokens(1, "a"));
    w->Write(Final(2, "b"));
    return grpc::Status::OK;
  };
  std::atomic<int> prefills{0}, elastic_prefills{0}, moves{0};
  grpc::Status move_status = grpc::Status::OK;  // ElasticMoveMaster's answer
  absl::Mutex mu;
  std::vector<ElasticPrefillRequest> elastic_requests ABSL_GUARDED_BY(mu);
  std::vector<internal::v1::ElasticMoveRequest> move_requests ABSL_GUARDED_BY(mu);
  std::multiset<std::string> aborts ABSL_GUARDED_BY(mu);

  grpc::Status GetLoad(grpc::ServerContext*, const internal::v1::LoadRequest*,
                       internal::v1::LoadReport* load) override {
    load->set_instance_id(id_);
    load->set_accepting(true);
    load->set_kv_token_slots_free(static_cast<uint64_t>(slots.load()));
    load->set_kv_blocks_free(static_cast<uint32_t>(slots.load() / kBlock));
    return grpc::Status::OK;
  }
  grpc::Status Prefill(grpc::ServerContext* ctx, const PrefillRequest*, Writer* w) override {
    ++prefills;
    return prefill(ctx, w);
  }
  grpc::Status ElasticPrefill(grpc::ServerContext* ctx, const ElasticPrefillRequest* r,
                              Writer* w) override {
    {
      absl::MutexLock lock(&mu);
      elastic_requests.push_back(*r);
    }
    ++elastic_prefills;
    return elastic(*r, ctx, w);
  }
  grpc::Status ElasticMoveMaster(grpc::ServerContext*, const internal::v1::ElasticMoveRequest* r,
                                 internal::v1::ElasticMoveAck*) override {
    {
      absl::MutexLock lock(&mu);
      move_requests.push_back(*r);
    }
    ++moves;
    return move_status;
  }
  grpc::Status Abort(grpc::ServerContext*, const internal::v1::AbortRequest* r,
                     internal::v1::AbortResponse*) override {
    absl::MutexLock lock(&mu);
    aborts.insert(r->request_id());
    return grpc::Status::OK;
  }
  size_t AbortsOf(const std::string& id) {
    absl::MutexLock lock(&mu);
    return aborts.count(id);
  }
  std::vector<ElasticPrefillRequest> ElasticRequests() {
    absl::MutexLock lock(&mu);
    return elastic_requests;
  }
};

ElasticPoolOptions PoolOptions() {
  ElasticPoolOptions o;
  o.config.per_degree = DefaultElasticStepModels(4);
  o.tick = absl::Milliseconds(5);
  return o;
}

// A router context with --elastic over fake elastic instances x0, x1, ... of
// the given capacities (in token slots, reported free at first).
class ElasticStack {
 public:
  explicit ElasticStack(const std::vector<int64_t>& slots,
                        ElasticPoolOptions options = PoolOptions())
      : table_({.poll_interval = absl::Milliseconds(20), .pool_elastic = true}),
        pool_(table_, metrics_, loop_, std::move(options)) {
    context_.options.model_id = "m";
    context_.options.presize = false;
    context_.options.max_model_len = 8192;
    context_.options.config.text.vocab_size = 1000;
    context_.instances = &table_;
    context_.metrics = &call_metrics_;
    context_.elastic = &pool_;
    for (size_t i = 0; i < slots.size(); ++i) {
      fakes.push_back(std::make_unique<FakeElastic>(absl::StrCat("x", i), slots[i]));
      Add(*fakes.back(), slots[i]);
    }
    table_.Start(loop_);
    REQUIRE(WaitFor([&] { return table_.Healthy(Role::kElastic).size() == slots.size(); }));
    pool_.Start();
  }
  ~ElasticStack() {
    pool_.Stop();
    table_.Stop();
    for (auto& s : servers_) s->Shutdown(absl::ZeroDuration());
  }
  const RouterContext& context() const { return context_; }
  metrics::Registry& metrics() { return metrics_; }
  ElasticPool& pool() { return pool_; }
  size_t TotalAbortsOf(const std::string& id) {
    size_t n = 0;
    for (auto& f : fakes) n += f->AbortsOf(id);
    return n;
  }

  std::vector<std::unique_ptr<FakeElastic>> fakes;

 private:
  void Add(FakeElastic& fake, int64_t slots) {
    auto server = StartGrpcServer("127.0.0.1:0", {&fake});
    REQUIRE(server.ok());
    internal::v1::InstanceInfo info;
    info.set_instance_id(fake.id_);
    info.set_role(internal::v1::INSTANCE_ROLE_ELASTIC);
    info.set_grpc_address(absl::StrCat("127.0.0.1:", (*server)->port()));
    info.mutable_capacity()->set_kv_blocks_total(static_cast<uint32_t>(slots / kBlock));
    info.mutable_capacity()->set_kv_block_size(kBlock);
    info.set_elastic_endpoint("ep-" + fake.id_);
    table_.Upsert(info);
    servers_.push_back(*std::move(server));
  }

  EventLoop loop_{{.name = "router"}};
  InstanceTable table_;
  metrics::Registry metrics_;
  CallMetrics call_metrics_{metrics_};
  ElasticPool pool_;
  RouterContext context_;
  std::vector<std::unique_ptr<GrpcServer>> servers_;
};

mmserve::v1::GenerateRequest Prompt(const std::string& id, int tokens, int max_tokens) {
  mmserve::v1::GenerateRequest r;
  r.set_request_id(id);
  for (int i = 0; i < tokens; ++i) r.mutable_raw()->add_token_ids(5);
  r.mutable_sampling()->set_max_tokens(static_cast<uint32_t>(max_tokens));
  return r;
}

std::shared_ptr<GenerateCall> Start(ElasticStack& stack, Outcome& outcome,
                                    mmserve::v1::GenerateRequest request) {
  return GenerateCall::Start(stack.context(), std::move(request), outcome.Sink(),
                             std::chrono::system_clock::now() + std::chrono::seconds(30));
}

// The pool holds nothing for anyone.
bool PoolEmpty(ElasticStack& stack) {
  const ElasticPool::Stats s = stack.pool().stats();
  return s.pending == 0 && s.promised_slots == 0 && s.members.empty();
}

// Every member of the stack got Abort(id) and the pool holds nothing.
void CheckAllAborted(ElasticStack& stack, const std::string& id) {
  CHECK(WaitFor([&] { return stack.TotalAbortsOf(id) == stack.fakes.size(); }));
  CHECK(WaitFor([&] { return PoolEmpty(stack); }));
}

void SetElastic(ElasticStack& stack, const FakeElastic::ElasticScript& script) {
  for (auto& f : stack.fakes) f->elastic = script;
}

// Runs `request` to its end: OK, the client got `text`.
void RunOk(ElasticStack& stack, mmserve::v1::GenerateRequest request, const std::string& text) {
  Outcome outcome;
  Start(stack, outcome, std::move(request));
  REQUIRE(outcome.WaitForEnd());
  CHECK(outcome.status().ok());
  CHECK(outcome.Text() == text);
}

// Runs `request` to its end: UNAVAILABLE after the client got `text`;
// every member got Abort and the pool holds nothing.
void RunUnavailable(ElasticStack& stack, mmserve::v1::GenerateRequest request,
                    const std::string& text) {
  const std::string id = request.request_id();
  Outcome outcome;
  Start(stack, outcome, std::move(request));
  REQUIRE(outcome.WaitForEnd());
  CHECK(outcome.status().code() == absl::StatusCode::kUnavailable);
  CHECK(outcome.Text() == text);
  CheckAllAborted(stack, id);
}

TEST_CASE("a request that fits one instance runs there at degree 1") {
  ElasticStack stack({2048, 2048});
  RunOk(stack, Prompt("r1", 100, 8), "ab");
  CHECK(stack.fakes[0]->prefills + stack.fakes[1]->prefills == 1);
  CHECK(stack.fakes[0]->elastic_prefills + stack.fakes[1]->elastic_prefills == 0);
  CHECK(WaitFor([&] { return PoolEmpty(stack); }));
  CHECK(stack.TotalAbortsOf("r1") == 0);
}

TEST_CASE("a prompt beyond one instance's pool runs on a group; every member gets Abort after") {
  ElasticStack stack({2048, 2048});
  RunOk(stack, Prompt("r2", 3000, 8), "abc");
  CHECK(stack.fakes[0]->prefills + stack.fakes[1]->prefills == 0);
  const auto a = stack.fakes[0]->ElasticRequests(), b = stack.fakes[1]->ElasticRequests();
  REQUIRE(a.size() == 1);
  REQUIRE(b.size() == 1);
  const internal::v1::ElasticPlan& plan = a[0].plan();
  CHECK(plan.SerializeAsString() == b[0].plan().SerializeAsString());
  CHECK(a[0].member() != b[0].member());
  REQUIRE(plan.members_size() == 2);
  int64_t rows = 0, kept = 0;
  for (const auto& m : plan.members()) {
    CHECK(m.endpoint() == "ep-" + m.instance_id());
    for (const auto& r : m.rows()) rows += r.end() - r.begin();
    kept += m.keep().end() - m.keep().begin();
    CHECK(m.keep().begin() % kBlock == 0);
  }
  CHECK(rows == 3000);
  CHECK(kept == 3000);
  CHECK(a[0].request().request_id() == "r2");
  CHECK(WaitFor([&] { return stack.fakes[0]->AbortsOf("r2") == 1; }));
  CHECK(WaitFor([&] { return stack.fakes[1]->AbortsOf("r2") == 1; }));
  CHECK(WaitFor([&] { return PoolEmpty(stack); }));
  // The same id again is a new group: the members' notices of the first
  // never match the second's.
  RunOk(stack, Prompt("r2", 3000, 8), "abc");
  const auto again = stack.fakes[0]->ElasticRequests();
  REQUIRE(again.size() == 2);
  CHECK(plan.group() != 0);
  CHECK(again[1].plan().group() != 0);
  CHECK(again[1].plan().group() != plan.group());
  CHECK(WaitFor([&] { return PoolEmpty(stack); }));
}

TEST_CASE("the pool refits degree 1's step-time model from its own prefills") {
  ElasticStack stack({2048, 2048});
  const std::vector<scheduler::StepTimeModel> given = DefaultElasticStepModels(4);
  // Each runs alone (a request beside another is no sample).
  RunOk(stack, Prompt("f1", 100, 3), "ab");
  REQUIRE(WaitFor([&] { return PoolEmpty(stack); }));
  RunOk(stack, Prompt("f2", 250, 3), "ab");
  REQUIRE(WaitFor([&] { return PoolEmpty(stack); }));
  ElasticPool::Stats s = stack.pool().stats();
  CHECK(s.fitted_degrees.empty());  // two lengths are not enough
  REQUIRE(s.step_models.size() == given.size());
  CHECK(s.step_models[0].Predict(500) == given[0].Predict(500));
  RunOk(stack, Prompt("f3", 600, 3), "ab");
  REQUIRE(WaitFor([&] { return stack.pool().stats().fitted_degrees == std::vector<int>{1}; }));
  s = stack.pool().stats();
  // The fakes answer at once: the measured prefills are far from the
  // default's times, and the next iterations plan by them.
  CHECK(s.step_models[0].Predict(600) != given[0].Predict(600));
  // Degree 2 keeps the default's ratio to degree 1: still no speed-up.
  for (int64_t tokens : {100, 1000, 3000}) {
    CHECK(s.step_models[1].Predict(tokens) >= s.step_models[0].Predict(tokens));
  }
}

TEST_CASE("a request placed beside a live one is no prefill sample") {
  ElasticPoolOptions options = PoolOptions();
  // A long average decode lets the manager place requests beside the
  // group's decode (the pause rule's gain).
  options.config.avg_decode_latency = 1000;
  ElasticStack stack({2048, 2048}, options);
  // A group decoding on both instances until cancelled.
  SetElastic(stack, [](const ElasticPrefillRequest& r, grpc::ServerContext* ctx, Writer* w) {
    if (r.member() == r.plan().sampler()) w->Write(Tokens(1, "a"));
    return UntilCancelled(ctx);
  });
  Outcome group;
  auto call = Start(stack, group, Prompt("busy", 3000, 8));
  REQUIRE(WaitFor([&] { return group.Text() == "a"; }));
  RunOk(stack, Prompt("b1", 100, 3), "ab");
  RunOk(stack, Prompt("b2", 250, 3), "ab");
  RunOk(stack, Prompt("b3", 600, 3), "ab");
  CHECK(stack.fakes[0]->prefills + stack.fakes[1]->prefills == 3);
  const ElasticPool::Stats st = stack.pool().stats();
  CHECK(st.members.count("busy") == 1);  // they ran beside the group
  CHECK(st.fitted_degrees.empty());
  call->Cancel("done");
  REQUIRE(group.WaitForEnd());
  CheckAllAborted(stack, "busy");
}

TEST_CASE("a request no group of the pool could hold is refused at once") {
  ElasticStack stack({2048, 2048});
  Outcome outcome;
  Start(stack, outcome, Prompt("r3", 4000, 200));
  REQUIRE(outcome.WaitForEnd());
  CHECK(outcome.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(stack.fakes[0]->elastic_prefills + stack.fakes[1]->elastic_prefills +
            stack.fakes[0]->prefills + stack.fakes[1]->prefills ==
        0);
  CHECK(PoolEmpty(stack));
}

TEST_CASE("a queued request that never finds slots ends after the queue wait") {
  ElasticPoolOptions options = PoolOptions();
  options.max_queue_wait = absl::Milliseconds(200);
  ElasticStack stack({2048}, options);
  stack.fakes[0]->slots = 0;  // reports no free slot from now on
  REQUIRE(WaitFor(
      [&] { return stack.context().instances->LastLoad("x0").kv_token_slots_free() == 0; }));
  Outcome outcome;
  Start(stack, outcome, Prompt("r4", 100, 8));
  REQUIRE(outcome.WaitForEnd());
  CHECK(outcome.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(stack.fakes[0]->prefills == 0);
  CHECK(PoolEmpty(stack));
}

TEST_CASE("cancelling a group's call cancels every stream and aborts every member") {
  ElasticStack stack({2048, 2048});
  SetElastic(stack, [](const ElasticPrefillRequest& r, grpc::ServerContext* ctx, Writer* w) {
    if (r.member() == r.plan().sampler()) w->Write(Tokens(1, "a"));
    return UntilCancelled(ctx);
  });
  Outcome outcome;
  auto call = Start(stack, outcome, Prompt("r5", 3000, 8));
  REQUIRE(WaitFor([&] { return outcome.Text() == "a"; }));
  call->Cancel("client went away");
  REQUIRE(outcome.WaitForEnd());
  CHECK(outcome.status().code() == absl::StatusCode::kCancelled);
  CheckAllAborted(stack, "r5");
}

TEST_CASE("a member that fails ends the call UNAVAILABLE and every member gets Abort") {
  ElasticStack stack({2048, 2048});
  SetElastic(stack, [](const ElasticPrefillRequest& r, grpc::ServerContext* ctx, Writer*) {
    if (r.member() != r.plan().master()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "member lost");
    }
    return UntilCancelled(ctx);
  });
  Outcome outcome;
  Start(stack, outcome, Prompt("r6", 3000, 8));
  REQUIRE(outcome.WaitForEnd());
  CHECK(outcome.status().code() == absl::StatusCode::kUnavailable);
  CheckAllAborted(stack, "r6");
}

TEST_CASE("a member's echo of another's abort waits for its reason; only echoes: the first") {
  const std::string echo = "elastic exchange: a peer gave up";
  for (const std::string& last :
       std::vector<std::string>{"temperature: must be >= 0",
                                "elastic exchange: a member did not join: a peer gave up"}) {
    INFO("the master ends with: " << last);
    ElasticStack stack({2048, 2048});
    auto echoed = std::make_shared<absl::Notification>();
    SetElastic(stack, [echo, last, echoed](const ElasticPrefillRequest& r, grpc::ServerContext* ctx,
                                           Writer*) {
      if (r.member() != r.plan().master()) {  // stops at the master's abort word, first
        echoed->Notify();
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, echo);
      }
      echoed->WaitForNotificationWithTimeout(absl::Seconds(10));
      // The router must not end the call on the echo (cancelling this stream).
      const absl::Time until = absl::Now() + absl::Seconds(1);
      while (!ctx->IsCancelled() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, last);
    });
    Outcome outcome;
    Start(stack, outcome, Prompt("r6e", 3000, 8));
    REQUIRE(outcome.WaitForEnd());
    CHECK(outcome.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(outcome.status().message() == (absl::StrContains(last, "gave up") ? echo : last));
    CheckAllAborted(stack, "r6e");
  }
}

TEST_CASE("a master lost mid-decode ends the call UNAVAILABLE after its tokens") {
  ElasticStack stack({2048, 2048});
  SetElastic(stack, [](const ElasticPrefillRequest& r, grpc::ServerContext*, Writer* w) {
    if (r.member() == r.plan().sampler()) w->Write(Tokens(1, "a"));
    if (r.member() != r.plan().master()) return grpc::Status::OK;
    w->Write(Tokens(2, "b"));
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "master lost");
  });
  RunUnavailable(stack, Prompt("r7", 3000, 8), "ab");
}

// Checks, from inside the fakes while calls run, that no instance is
// promised more than its capacity and that every member of a group got the
// same plan with one master.
struct Invariants {
  absl::Mutex mu;
  std::vector<std::string> violations ABSL_GUARDED_BY(mu);
  std::map<std::string, std::string> plan_of ABSL_GUARDED_BY(mu);

  void Check(ElasticPool& pool, const ElasticPrefillRequest* r) {
    const ElasticPool::Stats s = pool.stats();
    absl::MutexLock lock(&mu);
    for (const auto& [id, promised] : s.promised_by_instance) {
      if (promised > s.capacity_by_instance.at(id)) {
        violations.push_back(absl::StrCat(id, " promised ", promised));
      }
    }
    if (r == nullptr) return;
    if (r->plan().master() >= static_cast<uint32_t>(r->plan().members_size())) {
      violations.push_back("master outside the group");
    }
    auto [it, fresh] = plan_of.emplace(r->request().request_id(), r->plan().SerializeAsString());
    if (!fresh && it->second != r->plan().SerializeAsString()) {
      violations.push_back(r->request().request_id() + ": members got different plans");
    }
  }
};

TEST_CASE("property: promised slots stay within capacity, one plan and master per request") {
  ElasticStack stack({1024, 2048, 1536});
  Invariants inv;
  // Each call checks, then takes a moment so that calls overlap.
  auto check = [&stack, &inv](const ElasticPrefillRequest* r) {
    inv.Check(stack.pool(), r);
    absl::SleepFor(absl::Milliseconds(2));
  };
  for (auto& f : stack.fakes) {
    f->elastic = [check](const ElasticPrefillRequest& r, grpc::ServerContext* ctx, Writer* w) {
      check(&r);
      return SamplerThenMaster(r, ctx, w);
    };
    f->prefill = [check](grpc::ServerContext*, Writer* w) {
      check(nullptr);
      w->Write(Final(1, "a"));
      return grpc::Status::OK;
    };
  }
  std::mt19937 rng(26);
  std::vector<std::unique_ptr<Outcome>> outcomes;
  for (int k = 0; k < 40; ++k) {
    outcomes.push_back(std::make_unique<Outcome>());
    const int prompt = std::uniform_int_distribution<int>(20, 3400)(rng);
    const int max_tokens = std::uniform_int_distribution<int>(1, 64)(rng);
    Start(stack, *outcomes.back(), Prompt(absl::StrCat("p", k), prompt, max_tokens));
  }
  for (auto& o : outcomes) {
    REQUIRE(o->WaitForEnd());
    CHECK(o->status().ok());
  }
  absl::MutexLock lock(&inv.mu);
  CHECK(inv.violations.empty());
  CHECK(!inv.plan_of.empty());  // some requests needed a group
  CHECK(WaitFor([&] { return PoolEmpty(stack); }));
}

// The sampler writes the first token; the chain's first master the second,
// then moves; the next master waits for its ElasticMoveMaster (or the call's
// cancel) and writes the last.
FakeElastic::ElasticScript MovingMasters(ElasticStack& stack) {
  return [&stack](const ElasticPrefillRequest& r, grpc::ServerContext* ctx, Writer* w) {
    const std::vector<int> chain = language::ElasticMasterChain(r.plan());
    const int member = static_cast<int>(r.member());
    if (r.member() == r.plan().sampler()) w->Write(Tokens(1, "a"));
    if (member == chain[0]) {
      w->Write(Tokens(2, "b"));
      TokenBatch moved;
      moved.mutable_elastic_moved()->add_generated_token_ids(1);
      moved.mutable_elastic_moved()->add_generated_token_ids(2);
      w->Write(moved);
    } else if (chain.size() > 1 && member == chain[1]) {
      FakeElastic& me = *stack.fakes[r.plan().members(member).instance_id() == "x0" ? 0 : 1];
      WaitFor([&] { return me.moves > 0 || ctx->IsCancelled(); });
      if (me.moves == 0 || !me.move_status.ok()) return UntilCancelled(ctx);
      w->Write(Final(3, "c"));
    }
    return grpc::Status::OK;
  };
}

TEST_CASE("a decode tail past the first master's pool: the master moves, the stream goes on") {
  ElasticStack stack({2048, 2048});
  SetElastic(stack, MovingMasters(stack));
  // 2000 prompt tokens + 99 new: the first master holds 48 decode slots.
  RunOk(stack, Prompt("m1", 2000, 100), "abc");
  const auto plan = stack.fakes[0]->ElasticRequests().at(0).plan();
  const std::vector<int> chain = language::ElasticMasterChain(plan);
  REQUIRE(chain.size() == 2);
  CHECK(plan.members(chain[0]).decode().begin() == 2000);
  CHECK(plan.members(chain[1]).decode().end() == 2099);
  FakeElastic& next = *stack.fakes[plan.members(chain[1]).instance_id() == "x0" ? 0 : 1];
  CHECK(next.moves == 1);
  {
    absl::MutexLock lock(&next.mu);
    REQUIRE(next.move_requests.size() == 1);
    CHECK(next.move_requests[0].request_id() == "m1");
    CHECK(next.move_requests[0].state().generated_token_ids_size() == 2);
  }
  CHECK(absl::StrContains(stack.metrics().Render(),
                          "\nmmserve_router_elastic_master_moves_total 1\n"));
  CheckAllAborted(stack, "m1");
}

TEST_CASE("the pool learns decoding and master moves from the call's phase changes") {
  ElasticStack stack({2048, 2048});
  // A group of two: the sampler's hand-over to the master is not a move;
  // a hand-over to another member is.
  absl::Notification placed;
  std::optional<ElasticPlacement> placement;
  REQUIRE(stack.pool()
              .Submit({.id = "p1",
                       .prompt_tokens = 3000,
                       .max_tokens = 8,
                       .on_placed =
                           [&](absl::StatusOr<ElasticPlacement> p) {
                             REQUIRE(p.ok());
                             placement = *std::move(p);
                             placed.Notify();
                           }})
              .ok());
  REQUIRE(placed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  REQUIRE(placement->plan.has_value());
  const size_t master = placement->plan->master();
  const size_t other = 1 - master;
  const auto moves = [&] {
    return absl::StrContains(stack.metrics().Render(),
                             "\nmmserve_router_elastic_master_moves_total 1\n");
  };
  stack.pool().PhaseChanged("p1", CallPhase::kPrefilling, other);
  stack.pool().PhaseChanged("p1", CallPhase::kDecoding, other);
  stack.pool().PhaseChanged("p1", CallPhase::kHandedOver, master);
  CHECK_FALSE(moves());
  stack.pool().PhaseChanged("p1", CallPhase::kHandedOver, other);
  CHECK(moves());
  stack.pool().Finished("p1");
  CHECK(WaitFor([&] { return PoolEmpty(stack); }));
}

TEST_CASE("a next master that refuses the move ends the call UNAVAILABLE, every member aborted") {
  ElasticStack stack({2048, 2048});
  SetElastic(stack, MovingMasters(stack));
  for (auto& f : stack.fakes) f->move_status = grpc::Status(grpc::StatusCode::NOT_FOUND, "gone");
  RunUnavailable(stack, Prompt("m2", 2000, 100), "ab");
}

}  // namespace
}  // namespace mmserve::router
