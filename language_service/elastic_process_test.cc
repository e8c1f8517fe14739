// Group prefills across `language --role=elastic` processes over
// real UCX, on the demo model: the members' endpoints come from their
// registration (InstanceInfo.elastic_endpoint), captured by a small Registry in
// the test; each member gets ElasticPrefill with a hand-built plan. The tokens
// equal the in-process engine's greedy ones (shm and tcp). Faults, over shm
// and tcp: a member killed mid-exchange and a span holder killed mid-decode
// end the survivor's call UNAVAILABLE within 2 s, and it holds nothing
// after; the master killed mid-decode leaves the holder nothing within 2 s
// though no router aborts its span (it sees the master's process gone).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/sanitizer.h"
#include "proto/language.grpc.pb.h"
#include "proto/registry.grpc.pb.h"
#include "worker/engine.h"

extern char** environ;

namespace mmserve::language {
namespace {

namespace v1 = ::mmserve::internal::v1;

constexpr char kModel[] = "models/shapes-demo";
constexpr int kBlock = 16;  // the engine's default block size

const std::string kText =
    "Elastic sequence parallelism spreads one long prompt over several instances: each "
    "computes its rows, exchanges keys and values every layer and keeps a span of them.";

// Captures the instances' registrations.
class FakeRegistry final : public v1::Registry::CallbackService {
 public:
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const v1::RegisterRequest* request,
                                     v1::RegisterResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      seen_[request->instance().instance_id()] = request->instance();
    }
    response->set_heartbeat_interval_s(1);
    return Ok(ctx);
  }
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const v1::HeartbeatRequest*,
                                      v1::HeartbeatResponse* response) override {
    response->set_known(true);
    return Ok(ctx);
  }
  grpc::ServerUnaryReactor* Deregister(grpc::CallbackServerContext* ctx,
                                       const v1::DeregisterRequest*,
                                       v1::DeregisterResponse*) override {
    return Ok(ctx);
  }
  v1::InstanceInfo Await(const std::string& id) {
    absl::MutexLock lock(&mu_);
    auto known = [&] { return seen_.count(id) != 0; };
    mu_.AwaitWithTimeout(absl::Condition(&known), absl::Seconds(60));
    REQUIRE(seen_.count(id) != 0);
    return seen_[id];
  }

 private:
  static grpc::ServerUnaryReactor* Ok(grpc::CallbackServerContext* ctx) {
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  absl::Mutex mu_;
  std::map<std::string, v1::InstanceInfo> seen_ ABSL_GUARDED_BY(mu_);
};

// One `language --role=elastic` process.
struct Member {
  pid_t pid = -1;
  v1::InstanceInfo info;
  std::unique_ptr<v1::Language::Stub> stub;
  void Kill() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
  ~Member() {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
  }
};

std::unique_ptr<Member> Spawn(FakeRegistry& registry, const std::string& registry_address,
                              const std::string& id, const std::string& profile,
                              int step_delay_ms) {
  std::vector<std::string> args = {"language_service/language",
                                   "--role=elastic",
                                   "--model_dir=" + std::string(kModel),
                                   "--port=0",
                                   "--metrics_port=-1",
                                   "--threads=1",
                                   "--kv_cache_mb=8",
                                   "--instance_id=" + id,
                                   "--router=" + registry_address,
                                   "--profile=" + profile,
                                   "--test_elastic_step_delay_ms=" + std::to_string(step_delay_ms)};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  auto m = std::make_unique<Member>();
  REQUIRE(posix_spawn(&m->pid, argv[0], nullptr, nullptr, argv.data(), environ) == 0);
  m->info = registry.Await(id);
  m->stub = v1::Language::NewStub(InternalChannel(m->info.grpc_address()));
  return m;
}

// The in-process engine's greedy tokens and prompt length (the reference).
struct Reference {
  std::vector<uint32_t> tokens;
  uint32_t prompt_len = 0;
};

Reference Greedy(const std::string& text, int max_tokens) {
  worker::EngineOptions o;
  o.model_dir = kModel;
  o.num_threads = 1;
  o.kv_cache_bytes = 8 << 20;
  auto engine = worker::LlmEngine::Create(o);
  REQUIRE(engine.ok());
  worker::EngineRequest r;
  r.id = "ref";
  r.prompt = text;
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  Reference ref;
  REQUIRE((*engine)
              ->AddRequest(std::move(r),
                           [&](const worker::StreamEvent& e) {
                             for (int32_t t : e.token_ids) ref.tokens.push_back(t);
                             if (e.finish_reason != worker::FinishReason::kNone) {
                               ref.prompt_len = static_cast<uint32_t>(e.prompt_tokens);
                             }
                           })
              .ok());
  while ((*engine)->has_unfinished()) REQUIRE((*engine)->Step().ok());
  return ref;
}

v1::ElasticPrefillRequest MemberRequest(const std::vector<std::unique_ptr<Member>>& members,
                                        const std::string& id, const std::string& text,
                                        int max_tokens, uint32_t len, int member) {
  v1::ElasticPrefillRequest r;
  v1::PrefillRequest* p = r.mutable_request();
  p->set_request_id(id);
  p->mutable_raw()->set_text(text);
  p->mutable_sampling()->set_temperature(0);
  p->mutable_sampling()->set_max_tokens(static_cast<uint32_t>(max_tokens));
  p->mutable_sampling()->set_ignore_eos(true);
  // Member 0 computes the first half and keeps the blocks before it; member
  // 1 the rest, samples and masters.
  const uint32_t half = len / 2, cut = half / kBlock * kBlock;
  const uint32_t rows[3] = {0, half, len}, keep[3] = {0, cut, len};
  for (int m = 0; m < 2; ++m) {
    v1::ElasticMember* e = r.mutable_plan()->add_members();
    e->set_instance_id(members[m]->info.instance_id());
    e->add_rows()->set_begin(rows[m]);
    e->mutable_rows(0)->set_end(rows[m + 1]);
    e->mutable_keep()->set_begin(keep[m]);
    e->mutable_keep()->set_end(keep[m + 1]);
    e->set_endpoint(members[m]->info.elastic_endpoint());
  }
  r.mutable_plan()->set_sampler(1);
  r.mutable_plan()->set_master(1);
  r.set_member(static_cast<uint32_t>(member));
  return r;
}

struct Call {
  std::vector<uint32_t> tokens;
  grpc::Status status;
  Stopwatch ended;  // restarted when the stream ends
  std::atomic<bool> done{false};
  grpc::ClientContext ctx;
};

std::thread Open(Member& m, const v1::ElasticPrefillRequest& r, Call* call) {
  return std::thread([&m, r, call] {
    auto reader = m.stub->ElasticPrefill(&call->ctx, r);
    v1::TokenBatch b;
    while (reader->Read(&b)) {
      call->tokens.insert(call->tokens.end(), b.token_ids().begin(), b.token_ids().end());
    }
    call->status = reader->Finish();
    call->ended = Stopwatch();
    call->done = true;
  });
}

// Both members' calls for one request of kText.
std::vector<std::thread> OpenGroup(const std::vector<std::unique_ptr<Member>>& members,
                                   const std::string& id, int max_tokens, uint32_t len,
                                   Call* calls) {
  std::vector<std::thread> threads;
  for (int m = 0; m < 2; ++m) {
    threads.push_back(
        Open(*members[m], MemberRequest(members, id, kText, max_tokens, len, m), &calls[m]));
  }
  return threads;
}

// Seconds from `since` until `m` holds nothing (every block free, no
// request), or -1 after 10 s.
double SecondsUntilIdle(Member& m, const Stopwatch& since) {
  const Deadline d = Deadline::After(absl::Seconds(10));
  while (!d.Expired()) {
    v1::LoadReport load;
    grpc::ClientContext ctx;
    if (m.stub->GetLoad(&ctx, v1::LoadRequest(), &load).ok() && load.running() == 0 &&
        load.waiting() == 0 && load.kv_blocks_free() == m.info.capacity().kv_blocks_total()) {
      return since.ElapsedSeconds();
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return -1;
}

bool Idle(Member& m) { return SecondsUntilIdle(m, Stopwatch()) >= 0; }

uint32_t UsedBlocks(Member& m) {
  v1::LoadReport load;
  grpc::ClientContext ctx;
  REQUIRE(m.stub->GetLoad(&ctx, v1::LoadRequest(), &load).ok());
  return m.info.capacity().kv_blocks_total() - load.kv_blocks_free();
}

void AbortAll(const std::vector<std::unique_ptr<Member>>& members, const std::string& id) {
  for (const auto& m : members) {
    if (m->pid <= 0) continue;
    v1::AbortRequest a;
    a.set_request_id(id);
    v1::AbortResponse ar;
    grpc::ClientContext ctx;
    CHECK(m->stub->Abort(&ctx, a, &ar).ok());
  }
}

struct Stack {
  FakeRegistry registry;
  std::unique_ptr<GrpcServer> server;
  std::string address;
  std::vector<std::unique_ptr<Member>> members;
  Stack(const std::string& profile, int step_delay_ms) {
    auto s = StartGrpcServer("127.0.0.1:0", {&registry});
    REQUIRE(s.ok());
    server = std::move(*s);
    server->SetServing(true);
    address = "127.0.0.1:" + std::to_string(server->port());
    for (int m = 0; m < 2; ++m) {
      members.push_back(
          Spawn(registry, address, "elastic-" + std::to_string(m), profile, step_delay_ms));
    }
  }
  ~Stack() {
    members.clear();
    server->Shutdown(absl::Seconds(1));
  }
};

TEST_CASE("two elastic processes serve a group prefill with the reference tokens", "[elastic]") {
  const Reference ref = Greedy(kText, 8);
  REQUIRE(ref.tokens.size() == 8);
  REQUIRE(ref.prompt_len > 2 * kBlock);
  for (const std::string profile : {"shm", "tcp"}) {
    INFO(profile);
    Stack stack(profile, 0);
    for (int round = 0; round < 2; ++round) {
      const std::string id = "group-" + std::to_string(round);
      Call calls[2];
      for (std::thread& t : OpenGroup(stack.members, id, 8, ref.prompt_len, calls)) t.join();
      INFO(calls[0].status.error_message() << " / " << calls[1].status.error_message());
      REQUIRE(calls[0].status.ok());
      REQUIRE(calls[1].status.ok());
      CHECK(calls[0].tokens.empty());
      CHECK(calls[1].tokens == ref.tokens);
      // Member 0 keeps its range's blocks until the Abort; the master none.
      const uint32_t cut = ref.prompt_len / 2 / kBlock * kBlock;
      CHECK(UsedBlocks(*stack.members[0]) == cut / kBlock);
      AbortAll(stack.members, id);
      CHECK(Idle(*stack.members[0]));
      CHECK(Idle(*stack.members[1]));
    }
  }
}

// A kill must end a survivor's wait within 2 s (shm included: the boards
// check their peers' processes, transfer/ucx_notice_board.h).
constexpr double kWithinS = 2.0 * kSanitizerSlowdown;

TEST_CASE("a member killed mid-exchange ends the survivor's call UNAVAILABLE", "[elastic]") {
  const Reference ref = Greedy(kText, 4);
  for (const std::string profile : {"shm", "tcp"}) {
    INFO(profile);
    Stack stack(profile, 300);  // each layer waits 300 ms: the kill lands mid-exchange
    Call calls[2];
    std::vector<std::thread> threads = OpenGroup(stack.members, "kill-x", 4, ref.prompt_len, calls);
    // Member 0 holds its span once it joined the group.
    const Deadline joined = Deadline::After(absl::Seconds(20));
    while (UsedBlocks(*stack.members[0]) == 0 && !joined.Expired()) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    stack.members[1]->Kill();
    const Stopwatch killed;
    for (std::thread& t : threads) t.join();
    INFO(calls[0].status.error_message());
    CHECK(calls[0].status.error_code() == grpc::StatusCode::UNAVAILABLE);
    CHECK(killed.ElapsedSeconds() - calls[0].ended.ElapsedSeconds() < kWithinS);
    // No pid or segment at the edge.
    CHECK(calls[0].status.error_message().find("pid") == std::string::npos);
    const double idle_s = SecondsUntilIdle(*stack.members[0], killed);
    CHECK(idle_s >= 0);
    CHECK(idle_s < kWithinS);
  }
}

// The group of kText with 200 tokens to decode, the holder's part done,
// the master streaming: the test kills one of them.
struct Decoding {
  // Joins what is left, before the calls and the stack go (also when a
  // REQUIRE in the constructor throws).
  struct Joiner {
    std::vector<std::thread> threads;
    ~Joiner() {
      for (std::thread& t : threads) {
        if (t.joinable()) t.join();
      }
    }
  };
  Stack stack;
  Call calls[2];
  Joiner open;
  Decoding(const std::string& profile, const std::string& id, uint32_t prompt_len)
      : stack(profile, 20) {  // decode steps of 20 ms: 200 tokens take 4 s
    open.threads = OpenGroup(stack.members, id, 200, prompt_len, calls);
    open.threads[0].join();
    REQUIRE(calls[0].status.ok());  // the holder's part is done
    const Deadline decoding = Deadline::After(absl::Seconds(20));
    while (calls[1].tokens.size() < 3 && !calls[1].done && !decoding.Expired()) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    REQUIRE(!calls[1].done);
  }
};

TEST_CASE("a span holder killed mid-decode ends the master's call UNAVAILABLE", "[elastic]") {
  const Reference ref = Greedy(kText, 4);
  for (const std::string profile : {"shm", "tcp"}) {
    INFO(profile);
    Decoding run(profile, "kill-d", ref.prompt_len);
    run.stack.members[0]->Kill();
    const Stopwatch killed;
    run.open.threads[1].join();
    INFO(run.calls[1].status.error_message());
    CHECK(run.calls[1].status.error_code() == grpc::StatusCode::UNAVAILABLE);
    CHECK(run.calls[1].tokens.size() < 200);
    CHECK(killed.ElapsedSeconds() - run.calls[1].ended.ElapsedSeconds() < kWithinS);
    CHECK(run.calls[1].status.error_message().find("pid") == std::string::npos);
    const double idle_s = SecondsUntilIdle(*run.stack.members[1], killed);
    CHECK(idle_s >= 0);
    CHECK(idle_s < kWithinS);
  }
}

// No router here to Abort the holder's span: it sees its master's process
// gone and frees the span itself.
TEST_CASE("the master killed mid-decode: the holder frees its span within 2 s", "[elastic]") {
  const Reference ref = Greedy(kText, 4);
  for (const std::string profile : {"shm", "tcp"}) {
    INFO(profile);
    Decoding run(profile, "kill-m", ref.prompt_len);
    REQUIRE(UsedBlocks(*run.stack.members[0]) > 0);
    run.stack.members[1]->Kill();
    const Stopwatch killed;
    run.open.threads[1].join();
    CHECK(run.calls[1].status.error_code() == grpc::StatusCode::UNAVAILABLE);
    const double idle_s = SecondsUntilIdle(*run.stack.members[0], killed);
    CHECK(idle_s >= 0);
    CHECK(idle_s < kWithinS);
  }
}

}  // namespace
}  // namespace mmserve::language
