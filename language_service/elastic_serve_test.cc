// Group prefills served by elastic instances, in one process
// over real gRPC and real UCX, shm and tcp: each member gets ElasticPrefill with
// a hand-built plan and the members' endpoints (ElasticCalls::endpoint,
// what main puts in the registration). The sampler's first token and the
// master's tokens are role both's; after the prefill each holder keeps
// exactly its range's blocks; Abort on every member leaves nothing held. A
// prompt longer than one instance's KV pool is served by two of them. A
// plan with decode ranges moves the master when its range is full (the
// test passes the state on as the router does): greedy and seeded tokens
// and text stay role both's, the old master keeps its KV as a held span.
// The KV bytes each member moved are what the plan's geometry says. A
// master's own requests decode in one batch with its group's request, each
// as role both's.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "language_service/elastic_plan.h"
#include "language_service/elastic_serve_testing.h"
#include "language_service/kv_bytes_moved.h"
#include "transfer/elastic_echo.h"

namespace mmserve::language::testing {
namespace {

// An instance's KV bytes moved of one kind (kv_bytes_moved.h).
struct Moved {
  double sent = 0, received = 0;
};
Moved BytesMoved(Instance& i, const std::string& kind) {
  const transfer::WireBytes b = KvBytesMoved(i.registry, kind);
  return {b.sent->value(), b.received->value()};
}

// What each member of a group moved: every layer, its rows' K and V (fp32)
// to each other member and theirs back (elastic_prefill); per decode step and
// layer, a query from the master to each other holder (header, one tag
// slot, q) and its partial back (out and log-sum-exp; elastic_decode).
void CheckBytesMoved(const std::vector<Instance*>& members, const std::vector<Share>& shares,
                     uint32_t master, int decode_steps, const std::vector<Moved>& prefill_before,
                     const std::vector<Moved>& decode_before) {
  const model::TextConfig& cfg = members[0]->core->config().text;
  const double layers = cfg.num_hidden_layers;
  const double kv_row = 2.0 * cfg.num_key_value_heads * cfg.head_dim() * sizeof(float);
  const double q_width = static_cast<double>(cfg.num_attention_heads * cfg.head_dim());
  const double query = 8 + 8 + q_width * sizeof(float);
  const double reply = (q_width + cfg.num_attention_heads) * sizeof(float);
  const double peers = static_cast<double>(members.size()) - 1;
  double len = 0, holders = 0;
  for (size_t m = 0; m < shares.size(); ++m) {
    len += shares[m].end - shares[m].begin;
    if (m != master && shares[m].keep_end > shares[m].keep_begin) ++holders;
  }
  const double per_holder = decode_steps * layers;
  for (size_t m = 0; m < members.size(); ++m) {
    INFO("member " << m);
    const double rows = shares[m].end - shares[m].begin;
    const Moved p = BytesMoved(*members[m], "elastic_prefill");
    CHECK(p.sent - prefill_before[m].sent == layers * rows * kv_row * peers);
    CHECK(p.received - prefill_before[m].received == layers * (len - rows) * kv_row);
    const bool holder = m != master && shares[m].keep_end > shares[m].keep_begin;
    const double sent = m == master ? per_holder * holders * query
                        : holder    ? per_holder * reply
                                    : 0;
    const double received = m == master ? per_holder * holders * reply
                            : holder    ? per_holder * query
                                        : 0;
    // A holder counts its last reply once the put returns, which may be
    // after the master has finished the request: wait for it to land.
    Moved d = BytesMoved(*members[m], "elastic_decode");
    for (int i = 0; i < 500 && (d.sent - decode_before[m].sent != sent ||
                                d.received - decode_before[m].received != received);
         ++i) {
      absl::SleepFor(absl::Milliseconds(10));
      d = BytesMoved(*members[m], "elastic_decode");
    }
    CHECK(d.sent - decode_before[m].sent == sent);
    CHECK(d.received - decode_before[m].received == received);
  }
}

// Runs `plan`'s group for one request and checks the streams against role
// both's, the held blocks, then aborts and checks nothing is left.
void CheckGroup(const std::vector<Instance*>& members, const std::vector<Share>& shares,
                uint32_t sampler, uint32_t master, const Stream& want,
                const std::function<v1::PrefillRequest(int)>& request) {
  const v1::ElasticPlan plan = MakePlan(members, shares, sampler, master);
  std::vector<Moved> prefill_before, decode_before;
  for (Instance* i : members) {
    prefill_before.push_back(BytesMoved(*i, "elastic_prefill"));
    decode_before.push_back(BytesMoved(*i, "elastic_decode"));
  }
  const std::vector<Stream> got = RunGroup(members, plan, request);
  for (size_t m = 0; m < members.size(); ++m) {
    INFO("member " << m << ": " << got[m].out.status.error_message());
    REQUIRE(got[m].out.status.ok());
    if (m != sampler && m != master) CHECK(got[m].out.tokens.empty());
  }
  // The sampler's stream: the first token; the master's: the rest.
  REQUIRE(!got[sampler].out.tokens.empty());
  std::vector<uint32_t> tokens = {got[sampler].out.tokens.front()};
  if (sampler != master) CHECK(got[sampler].out.tokens.size() == 1);
  const std::vector<uint32_t>& rest = got[master].out.tokens;
  tokens.insert(tokens.end(), rest.begin() + (sampler == master ? 1 : 0), rest.end());
  CHECK(tokens == want.out.tokens);
  CHECK(got[master].out.finish == want.out.finish);
  if (sampler == master) CHECK(got[master].out.text == want.out.text);
  // The first token came from the prefill, each other from a decode step.
  CheckBytesMoved(members, shares, master, static_cast<int>(tokens.size()) - 1, prefill_before,
                  decode_before);
  // Scale-down: a holder keeps exactly its range's blocks; the master freed
  // its own at the end, a member keeping nothing holds nothing.
  for (size_t m = 0; m < members.size(); ++m) {
    const uint32_t keep = m == master ? 0 : shares[m].keep_end - shares[m].keep_begin;
    INFO("member " << m);
    CHECK(UsedBlocks(*members[m], Blocks(keep)) == Blocks(keep));
    CHECK(members[m]->core->role().elastic_calls()->num_held_spans() == (keep > 0 ? 1u : 0u));
  }
  AbortAndCheckIdle(members, request(0).request_id());
}

std::vector<std::unique_ptr<Instance>> Elastic(int n, transfer::TransportProfile profile,
                                               int64_t kv_bytes = 8 << 20) {
  std::vector<std::unique_ptr<Instance>> out;
  for (int m = 0; m < n; ++m) {
    out.push_back(std::make_unique<Instance>(
        LanguageRole::kElastic, absl::Seconds(10), 1,
        InstanceOptions{"elastic-" + std::to_string(m), profile, kv_bytes}));
  }
  return out;
}

std::vector<Instance*> Ptrs(const std::vector<std::unique_ptr<Instance>>& v, int n) {
  std::vector<Instance*> out;
  for (int m = 0; m < n; ++m) out.push_back(v[m].get());
  return out;
}

TEST_CASE("a group of elastic instances gives role both's tokens, text and images", "[elastic]") {
  Instance both(LanguageRole::kBoth);
  FakeEncoder encoder(static_cast<uint32_t>(both.core->config().text.hidden_size));
  const std::string kImage = "<|vision_start|><|image_pad|><|vision_end|>";
  for (transfer::TransportProfile profile :
       {transfer::TransportProfile::kShm, transfer::TransportProfile::kTcp}) {
    INFO(transfer::TransportProfileName(profile));
    auto elastic = Elastic(3, profile);
    int n = 0;
    for (bool image : {false, true}) {
      const std::string text =
          image ? "Compare " + kImage + " with the sky, and tell me a story about both of them."
                : "Tell me a long story about elastic sequence parallelism across instances.";
      const mmserve::v1::SamplingParams s = Greedy(10);
      const std::string id = "elastic" + std::to_string(n++);
      auto request = [&](const std::string& tag) {
        v1::PrefillRequest r = Request(id, text, s);
        if (image) *r.add_images() = encoder.Publish(id + "@" + tag, 0, 1, 8, 6, 4242);
        return r;
      };
      const Stream want = RunBothWithUsage(both, request("both"));
      INFO(want.out.status.error_message());
      REQUIRE(want.out.status.ok());
      REQUIRE(want.out.tokens.size() == 10);
      const uint32_t len = want.prompt_tokens;
      REQUIRE(len > 24);
      auto member_request = [&](int m) { return request("m" + std::to_string(m)); };
      for (int size : {2, 3}) {
        INFO((image ? "image" : "text") << ", " << size << " members");
        const std::vector<Share> shares = EvenShares(len, size);
        CheckGroup(Ptrs(elastic, size), shares, size - 1, size - 1, want, member_request);
      }
      // The sampler computes the last rows and keeps nothing; the master
      // keeps the whole prompt and gets the first token over UCX.
      INFO("sampler apart from the master");
      const uint32_t a = len / 2;
      CheckGroup(Ptrs(elastic, 2), {{0, a, 0, len}, {a, len, len, len}}, 1, 0, want,
                 member_request);
    }
  }
}

TEST_CASE("a master decodes its group's request in the batch of its own requests", "[elastic]") {
  Instance both(LanguageRole::kBoth);
  auto elastic = Elastic(2, transfer::TransportProfile::kShm);
  const mmserve::v1::SamplingParams s = Greedy(10);
  const v1::PrefillRequest group =
      Request("group", "Tell me a long story about elastic sequence parallelism.", s);
  std::vector<v1::PrefillRequest> ordinary;
  for (int k = 0; k < 4; ++k) {
    ordinary.push_back(Request("own-" + std::to_string(k),
                               "Story number " + std::to_string(k) + " about the sea.", s));
  }
  const Stream want = RunBothWithUsage(both, group);
  REQUIRE(want.out.status.ok());
  std::vector<Output> want_own;
  for (const v1::PrefillRequest& r : ordinary) want_own.push_back(RunBoth(both, r));
  const v1::ElasticPlan plan =
      MakePlan(Ptrs(elastic, 2), EvenShares(want.prompt_tokens, 2), /*sampler=*/1, /*master=*/1);
  // The master's own requests are sent at the same time as the group's.
  std::vector<Output> own(ordinary.size());
  std::vector<std::thread> threads;
  for (size_t k = 0; k < ordinary.size(); ++k) {
    threads.emplace_back([&, k] { own[k] = RunBoth(*elastic[1], ordinary[k]); });
  }
  const std::vector<Stream> got = RunGroup(Ptrs(elastic, 2), plan, [&](int) { return group; });
  for (std::thread& t : threads) t.join();
  REQUIRE(got[1].out.status.ok());
  CHECK(got[1].out.tokens == want.out.tokens);
  CHECK(got[1].out.text == want.out.text);
  for (size_t k = 0; k < ordinary.size(); ++k) {
    INFO("own request " << k << ": " << own[k].status.error_message());
    REQUIRE(own[k].status.ok());
    CHECK(own[k].tokens == want_own[k].tokens);
    CHECK(own[k].text == want_own[k].text);
  }
  AbortAndCheckIdle(Ptrs(elastic, 2), "group");
}

TEST_CASE("a prompt longer than one instance's KV pool is served by two", "[elastic]") {
  Instance both(LanguageRole::kBoth);
  // 96 KiB: 96 tokens of the tiny model's KV (2 layers x K, V x 64 floats).
  auto elastic = Elastic(2, transfer::TransportProfile::kShm, 96 << 10);
  std::string text;
  for (int i = 0; i < 7; ++i) text += "the quick brown fox jumps over a lazy dog ";
  const v1::PrefillRequest request = Request("long", text, Greedy(6));
  const Stream want = RunBothWithUsage(both, request);
  REQUIRE(want.out.status.ok());
  const uint32_t len = want.prompt_tokens;
  const uint32_t pool = elastic[0]->core->Capacity().kv_blocks_total() * kBlock;
  INFO("prompt " << len << " tokens, pool " << pool);
  REQUIRE(len > pool);
  // Alone, one instance refuses it.
  const Output alone = RunBoth(*elastic[0], request);
  CHECK(alone.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CheckGroup(Ptrs(elastic, 2), EvenShares(len, 2), 1, 1, want, [&](int) { return request; });
  // A master that cannot hold the whole prompt fails RESOURCE_EXHAUSTED and
  // tells the other member, whose call ends with that code long before the
  // 10 s join timeout; neither holds anything.
  const uint32_t a = len / 2;
  const Stopwatch clock;
  v1::ElasticPlan full = MakePlan(Ptrs(elastic, 2), {{0, a, 0, len}, {a, len, len, len}}, 1, 0);
  full.set_group(7);
  const std::vector<Stream> got = RunGroup(Ptrs(elastic, 2), full, [&](int) { return request; });
  CHECK(got[0].out.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(got[1].out.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(clock.ElapsedSeconds() < 5.0);
  CHECK(elastic[0]->Idle());
  CHECK(elastic[1]->Idle());
  // The failed group's aborts may land on a board after its member left it:
  // a retry under the same id (the router places it as a new group) is
  // served all the same.
  CheckGroup(Ptrs(elastic, 2), EvenShares(len, 2), 1, 1, want, [&](int) { return request; });
}

TEST_CASE("a member refusing before its part began ends the others at once with its code",
          "[elastic]") {
  Instance both(LanguageRole::kBoth);
  auto elastic = Elastic(2, transfer::TransportProfile::kShm);
  const std::vector<Instance*> members = Ptrs(elastic, 2);
  const std::string text = "Tell me a long story about elastic sequence parallelism.";
  const v1::PrefillRequest request = Request("refused", text, Greedy(6));
  const Stream want = RunBothWithUsage(both, request);
  REQUIRE(want.out.status.ok());
  const uint32_t len = want.prompt_tokens;
  v1::PrefillRequest bad_sampling = request;
  bad_sampling.mutable_sampling()->set_temperature(-1);
  v1::PrefillRequest other_prompt = request;
  other_prompt.mutable_raw()->set_text(text + " And another one, longer, about the router.");
  struct Refusal {
    const char* what;
    v1::PrefillRequest master_gets;
  };
  uint64_t group = 1;
  for (const Refusal& r : {Refusal{"its request fails its checks", bad_sampling},
                           Refusal{"its prompt does not fit the plan", other_prompt}}) {
    INFO(r.what);
    // The master refuses; the other member has joined and waits for it.
    v1::ElasticPlan plan = MakePlan(members, EvenShares(len, 2), 1, 1);
    plan.set_group(group++);
    const Stopwatch clock;
    const std::vector<Stream> got =
        RunGroup(members, plan, [&](int m) { return m == 1 ? r.master_gets : request; });
    INFO(got[0].out.status.error_message() << " / " << got[1].out.status.error_message());
    CHECK(got[1].out.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(got[0].out.status.error_code() == got[1].out.status.error_code());
    // The other member's end is an echo (the router waits for the reason).
    CHECK(transfer::IsElasticEcho(got[0].out.status.error_message()));
    CHECK_FALSE(transfer::IsElasticEcho(got[1].out.status.error_message()));
    CHECK(clock.ElapsedSeconds() < 5.0);  // the join timeout is 10 s
    CHECK(elastic[0]->Idle());
    CHECK(elastic[1]->Idle());
    // The same id again, as a new group: served.
    CheckGroup(members, EvenShares(len, 2), 1, 1, want, [&](int) { return request; });
  }
}

// One stream's batches, in order, and how the move it asked for went.
struct Batches {
  std::vector<v1::TokenBatch> batches;
  grpc::Status status, move;
};

// Every member's ElasticPrefill at once; a stream's elastic_moved batch makes its
// reader pass the state to the next master of the chain, as the router
// does.
std::vector<Batches> RunMoving(
    const std::vector<Instance*>& members, const v1::ElasticPlan& plan,
    const v1::PrefillRequest& request,
    const std::function<void(v1::ElasticMoveRequest&)>& tamper = [](v1::ElasticMoveRequest&) {}) {
  const std::vector<int> chain = ElasticMasterChain(plan);
  std::vector<Batches> out(members.size());
  std::vector<std::thread> threads;
  for (size_t m = 0; m < members.size(); ++m) {
    threads.emplace_back([&, m] {
      grpc::ClientContext ctx;
      auto reader = members[m]->stub->ElasticPrefill(&ctx, MemberCall(plan, request, m));
      v1::TokenBatch b;
      while (reader->Read(&b)) {
        out[m].batches.push_back(b);
        if (!b.has_elastic_moved()) continue;
        const auto at = std::find(chain.begin(), chain.end(), static_cast<int>(m));
        if (at + 1 >= chain.end()) {  // no Catch2 assertions off the test's thread
          out[m].move = grpc::Status(grpc::StatusCode::INTERNAL, "the last master moved");
          continue;
        }
        v1::ElasticMoveRequest move;
        move.set_request_id(request.request_id());
        *move.mutable_state() = b.elastic_moved();
        tamper(move);
        grpc::ClientContext move_ctx;
        v1::ElasticMoveAck ack;
        out[m].move = members[*(at + 1)]->stub->ElasticMoveMaster(&move_ctx, move, &ack);
      }
      out[m].status = reader->Finish();
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

// The client's view: the sampler's first token, then each master's
// batches in chain order.
Output Assemble(const std::vector<Batches>& got, const v1::ElasticPlan& plan) {
  Output out;
  auto add = [&out](const v1::TokenBatch& b) {
    out.tokens.insert(out.tokens.end(), b.token_ids().begin(), b.token_ids().end());
    out.text += b.text();
    if (b.finish_reason() != mmserve::v1::FINISH_REASON_UNSPECIFIED) out.finish = b.finish_reason();
  };
  const int sampler = static_cast<int>(plan.sampler());
  REQUIRE(!got[sampler].batches.empty());
  add(got[sampler].batches[0]);
  for (int m : ElasticMasterChain(plan)) {
    for (size_t k = m == sampler ? 1 : 0; k < got[m].batches.size(); ++k) add(got[m].batches[k]);
  }
  return out;
}

// n members: member 0 computes the first rows and keeps the whole prompt;
// the last computes the last rows and samples. Decode: member 0 masters
// [len, x) (x: the block after the prompt's, 5 to 8 tokens), then each
// next member 4 tokens, the last the rest.
v1::ElasticPlan MovingPlan(const std::vector<Instance*>& members, uint32_t len,
                           uint32_t max_tokens) {
  const int n = static_cast<int>(members.size());
  std::vector<Share> shares(n);
  for (int m = 0; m < n; ++m) {
    shares[m].begin = len * m / n;
    shares[m].end = len * (m + 1) / n;
  }
  shares[0].keep_end = len;
  v1::ElasticPlan plan = MakePlan(members, shares, n - 1, 0);
  uint32_t begin = len, end = (len / kBlock + 2) * kBlock;
  for (int m = 0; m < n; ++m) {
    if (m == n - 1) end = std::max(end, len + max_tokens);
    plan.mutable_members(m)->mutable_decode()->set_begin(begin);
    plan.mutable_members(m)->mutable_decode()->set_end(end);
    begin = end;
    end += kBlock;
  }
  return plan;
}

// The instance's master moves (its metric, as rendered).
double Moves(Instance& i) {
  const std::string name = "\nmmserve_language_elastic_master_moves_total ";
  const std::string text = i.registry.Render();
  const size_t at = text.find(name);
  return at == std::string::npos ? 0 : std::stod(text.substr(at + name.size()));
}

TEST_CASE("a master whose range is full moves on without copying KV; tokens stay role both's",
          "[elastic]") {
  Instance both(LanguageRole::kBoth);
  const std::string text =
      "Tell me a long story about elastic sequence parallelism across instances.";
  constexpr uint32_t kTokens = 16;
  for (transfer::TransportProfile profile :
       {transfer::TransportProfile::kShm, transfer::TransportProfile::kTcp}) {
    auto elastic = Elastic(3, profile);
    int n = 0;
    for (int size : {2, 3}) {
      for (bool seeded : {false, true}) {
        INFO(transfer::TransportProfileName(profile)
             << ", " << size << " members" << (seeded ? ", seeded" : ", greedy"));
        mmserve::v1::SamplingParams s = Greedy(kTokens);
        if (seeded) {
          s.set_temperature(0.9f);
          s.set_top_p(0.95f);
          s.set_seed(4321);
        }
        const v1::PrefillRequest request = Request("move" + std::to_string(n++), text, s);
        const Stream want = RunBothWithUsage(both, request);
        REQUIRE(want.out.status.ok());
        REQUIRE(want.out.tokens.size() == kTokens);
        const uint32_t len = want.prompt_tokens;
        const std::vector<Instance*> members = Ptrs(elastic, size);
        const v1::ElasticPlan plan = MovingPlan(members, len, kTokens);
        REQUIRE(CheckElasticPlan(plan, len, kBlock).ok());
        std::vector<double> moves_before;
        for (Instance* i : members) moves_before.push_back(Moves(*i));
        const std::vector<Batches> got = RunMoving(members, plan, request);
        for (size_t m = 0; m < members.size(); ++m) {
          INFO("member " << m << ": " << got[m].status.error_message() << " / "
                         << got[m].move.error_message());
          REQUIRE(got[m].status.ok());
          REQUIRE(got[m].move.ok());
        }
        const Output out = Assemble(got, plan);
        CHECK(out.tokens == want.out.tokens);
        CHECK(out.text == want.out.text);
        CHECK(out.finish == want.out.finish);
        // Every master but the last moved once; each keeps its span (the
        // first: the prompt and its range; the others: their range) as a
        // held span, the last freed its own at the end. No KV moved.
        for (int m = 0; m < size; ++m) {
          INFO("member " << m);
          const bool last = m == size - 1;
          CHECK(Moves(*members[m]) - moves_before[m] == (last ? 0 : 1));
          const v1::ElasticRowRange& d = plan.members(m).decode();
          const uint32_t held = last ? 0 : (m == 0 ? d.end() : d.end() - d.begin());
          CHECK(UsedBlocks(*members[m], Blocks(held)) == Blocks(held));
          CHECK(members[m]->core->role().elastic_calls()->num_held_spans() == (last ? 0u : 1u));
        }
        AbortAndCheckIdle(members, request.request_id());
      }
    }
  }
}

TEST_CASE("a move the next master cannot continue ends its stream; nothing is left", "[elastic]") {
  auto elastic = Elastic(2, transfer::TransportProfile::kShm);
  const std::vector<Instance*> members = Ptrs(elastic, 2);
  const v1::PrefillRequest request =
      Request("badmove", "Tell me a story about moving masters and their spans.", Greedy(16));
  Instance both(LanguageRole::kBoth);
  const Stream want = RunBothWithUsage(both, request);
  REQUIRE(want.out.status.ok());
  const v1::ElasticPlan plan = MovingPlan(members, want.prompt_tokens, 16);
  // Unknown requests are not found.
  v1::ElasticMoveRequest move;
  move.set_request_id("nobody");
  move.mutable_state()->add_generated_token_ids(1);
  grpc::ClientContext ctx;
  v1::ElasticMoveAck ack;
  CHECK(members[1]->stub->ElasticMoveMaster(&ctx, move, &ack).error_code() ==
        grpc::StatusCode::NOT_FOUND);
  // A state one token short of the next master's range: refused, and its
  // stream ends INVALID_ARGUMENT.
  const std::vector<Batches> got = RunMoving(members, plan, request, [](v1::ElasticMoveRequest& m) {
    m.mutable_state()->mutable_generated_token_ids()->RemoveLast();
  });
  CHECK(got[0].status.ok());
  CHECK(got[0].move.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(got[1].status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  AbortAndCheckIdle(members, request.request_id());
}

}  // namespace
}  // namespace mmserve::language::testing
