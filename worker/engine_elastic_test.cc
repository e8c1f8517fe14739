// A request an elastic group prefilled, mastered by an engine
// (LlmEngine::StartMastering): two engines prefill it with the in-process
// K/V exchange (the holder keeps the prompt's head, the master its tail and
// the new tokens), the holder answers the master's span queries in process,
// and the master decodes it in its batch beside ordinary requests:
// - each request, the group's and the ordinary ones, gets exactly the
//   tokens and text it gets alone (greedy and seeded sampling), beside 3
//   and beside 16 ordinary requests;
// - a holder that fails ends the group's request (kAbort, the error) and
//   only it;
// - nothing leaks: every block of both engines is free again at the end;
// - the group's first token goes through the engine's sampling and emit
//   path: the sampler's event is role both's (tokens, text, finish by
//   max_tokens or a stop id), a member that takes it ends
//   the same way with the same random stream.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/file.h"
#include "model/cpu/split_attention.h"
#include "model/cpu/thread_pool.h"
#include "model/elastic_local_exchange.h"
#include "worker/engine.h"

namespace mmserve::worker {
namespace {

constexpr char kModel[] = "model/testdata/models/qwen2vl-tiny-gqa2-untied-sharded";
constexpr int kBlock = 4;

std::unique_ptr<LlmEngine> MakeEngine() {
  EngineOptions o;
  o.model_dir = kModel;
  o.block_size = kBlock;
  o.max_num_batched_tokens = 64;
  o.max_num_seqs = 32;
  o.kv_cache_bytes = 8 << 20;
  auto e = LlmEngine::Create(o);
  INFO(e.status().ToString());
  REQUIRE(e.ok());
  return std::move(*e);
}

// The golden chat prompt's ids.
std::vector<int32_t> ChatIds() {
  auto text =
      ReadFileToString("model/testdata/goldens/qwen2vl-tiny-gqa2-untied-sharded/lm_golden.json");
  REQUIRE(text.ok());
  const nlohmann::json golden = nlohmann::json::parse(*text);
  for (const auto& p : golden["prompts"]) {
    if (p["compute_dtype"] == "fp32" && p["name"] == "chat") {
      return p["input_ids"].get<std::vector<int32_t>>();
    }
  }
  FAIL("no chat prompt");
  return {};
}

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  absl::Status error;
};

void Add(Collected* c, const StreamEvent& e) {
  c->tokens.insert(c->tokens.end(), e.token_ids.begin(), e.token_ids.end());
  c->text += e.text;
  if (e.finish_reason != FinishReason::kNone) {
    c->finish = e.finish_reason;
    c->error = e.error;
  }
}

StreamCallback Collect(Collected* c) {
  return [c](const StreamEvent& e) { Add(c, e); };
}

void RunToEnd(LlmEngine& e) {
  for (int steps = 0; e.has_unfinished(); ++steps) {
    REQUIRE(steps < 5000);
    REQUIRE(e.Step().ok());
  }
}

model::SamplingParams Sampling(bool seeded, int max_tokens) {
  model::SamplingParams p;
  p.max_tokens = max_tokens;
  p.min_tokens = max_tokens;
  if (seeded) {
    p.temperature = 0.9f;
    p.top_p = 0.95f;
    p.seed = 17;
  } else {
    p.temperature = 0;
  }
  return p;
}

EngineRequest Request(const std::string& id, std::vector<int32_t> ids, bool seeded, int n) {
  EngineRequest r;
  r.id = id;
  r.prompt_token_ids = std::move(ids);
  r.sampling = Sampling(seeded, n);
  return r;
}

// The holder (member 0) in process: partial attention over its span for
// every row (the one group request), or an error once `fail_at` queries
// were answered.
class HolderPeers final : public model::SpanAttentionPeers, public MasterPeers {
 public:
  HolderPeers(LlmEngine& holder, std::vector<int32_t> blocks, int64_t keys)
      : holder_(holder), blocks_(std::move(blocks)), keys_(keys) {}
  int num_members() const override { return 2; }
  int self() const override { return 1; }
  absl::Status Query(int member, int layer, const float* q, int64_t rows, float* out,
                     float* lse) override {
    REQUIRE(member == 0);
    if (queries_++ == fail_at) return absl::UnavailableError("the holder is gone");
    const model::TextConfig& cfg = holder_.config().text;
    model::KvCache& kv = holder_.kv_cache();
    const model::cpu::PagedKvLayer layer_kv{kv.Key(layer), kv.Value(layer), kBlock,
                                            cfg.num_key_value_heads, cfg.head_dim()};
    std::vector<model::cpu::PartialSpan> spans;
    for (int64_t r = 0; r < rows; ++r) spans.push_back({r, blocks_.data(), keys_});
    const float scale = static_cast<float>(std::pow(static_cast<double>(cfg.head_dim()), -0.5));
    model::cpu::PartialAttention(pool_, q, cfg.num_attention_heads, layer_kv, spans, scale, out,
                                 lse);
    return absl::OkStatus();
  }
  absl::StatusOr<model::SpanAttentionPeers*> ForStep(absl::Span<const std::string> ids) override {
    REQUIRE(ids.size() == 1);
    return this;
  }
  int64_t fail_at = -1;

 private:
  LlmEngine& holder_;
  const std::vector<int32_t> blocks_;
  const int64_t keys_;
  int64_t queries_ = 0;
  model::cpu::ThreadPool pool_{1};
};

// Member `m`'s rows [begin, end) of r's prompt, keeping them in `blocks`
// (from token `begin`); the last row's logits when `logits`.
model::ElasticPrefillBatch Rows(const ElasticRequest& r, int64_t begin, int64_t end,
                                const std::vector<kvpool::BlockId>& blocks, bool logits) {
  model::ElasticPrefillBatch b;
  b.prompt_len = r.prompt_len();
  const int64_t n = end - begin;
  b.rows.positions.resize(3 * n);
  for (int64_t i = 0; i < n; ++i) {
    b.global_rows.push_back(begin + i);
    b.rows.token_ids.push_back(r.token_ids()[begin + i]);
    b.rows.positions[i] = r.positions().t[begin + i];
    b.rows.positions[n + i] = r.positions().h[begin + i];
    b.rows.positions[2 * n + i] = r.positions().w[begin + i];
    b.keep_slots.push_back(int64_t{blocks[i / kBlock].value} * kBlock + i % kBlock);
  }
  b.keep_begin = begin;
  if (logits) b.rows.logits_rows.push_back(n - 1);
  return b;
}

// Prefills `request` over `holder` (tokens [0, split)) and `master` (the
// rest, and the sampler), then hands it to the master's engine. The
// master's span holds room for `room` new tokens' KV (-1: all of
// max_tokens - 1, the whole decode).
std::unique_ptr<HolderPeers> StartGroup(LlmEngine& holder, LlmEngine& master,
                                        const EngineRequest& request, int64_t split, Collected* c,
                                        int64_t room = -1) {
  auto a = holder.PrepareElastic(request);
  auto b = master.PrepareElastic(request);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const int64_t len = (*b)->prompt_len();
  auto span_a = holder.HoldSpan(request.id, static_cast<int>(split));
  if (room < 0) room = (*b)->max_tokens() - 1;
  auto span_b = master.HoldSpan(request.id, static_cast<int>(len - split + room));
  REQUIRE(span_a.ok());
  REQUIRE(span_b.ok());
  const model::TextConfig& cfg = master.config().text;
  model::InProcessKvGroup group(2, cfg.num_hidden_layers, len,
                                cfg.num_key_value_heads * cfg.head_dim(), absl::Seconds(60));
  const model::ElasticPrefillBatch batch_a = Rows(**a, 0, split, *span_a, false);
  const model::ElasticPrefillBatch batch_b = Rows(**b, split, len, *span_b, true);
  std::vector<float> logits_a, logits_b;
  absl::Status status_a;
  std::thread t([&] {
    status_a = holder.model().ForwardElasticPrefill(batch_a, holder.kv_cache(), group.member(0),
                                                    &logits_a);
  });
  const absl::Status status_b =
      master.model().ForwardElasticPrefill(batch_b, master.kv_cache(), group.member(1), &logits_b);
  t.join();
  REQUIRE(status_a.ok());
  REQUIRE(status_b.ok());
  auto event = master.FirstElasticToken(**b, {.logits = absl::MakeSpan(logits_b)});
  REQUIRE(event.ok());
  Add(c, *event);
  std::vector<int32_t> blocks;
  for (kvpool::BlockId id : *span_a) blocks.push_back(id.value);
  auto peers = std::make_unique<HolderPeers>(holder, std::move(blocks), split);
  master.set_master_peers(peers.get());
  const ElasticRequest::MasterState state = (*b)->ExportState();
  REQUIRE(
      master
          .StartMastering(*std::move(b), state, {.kv_begin = split, .decode_group = 1}, Collect(c))
          .ok());
  return peers;
}

// The whole prompt of `request` prefilled on `e` alone (a group of one, its
// span held): the prepared request, its last row's logits in *logits.
std::unique_ptr<ElasticRequest> PrefillAlone(LlmEngine& e, const EngineRequest& request,
                                             std::vector<float>* logits) {
  auto r = e.PrepareElastic(request);
  REQUIRE(r.ok());
  const int64_t len = (*r)->prompt_len();
  auto span = e.HoldSpan(request.id, static_cast<int>(len));
  REQUIRE(span.ok());
  const model::TextConfig& cfg = e.config().text;
  model::InProcessKvGroup group(1, cfg.num_hidden_layers, len,
                                cfg.num_key_value_heads * cfg.head_dim(), absl::Seconds(60));
  REQUIRE(e.model()
              .ForwardElasticPrefill(Rows(**r, 0, len, *span, true), e.kv_cache(), group.member(0),
                                     logits)
              .ok());
  return std::move(*r);
}

// Ordinary request k: a head of the chat prompt, greedy or seeded.
EngineRequest Ordinary(int k, const std::vector<int32_t>& ids) {
  const size_t len = 5 + (k * 7) % (ids.size() - 5);
  return Request("ordinary-" + std::to_string(k),
                 std::vector<int32_t>(ids.begin(), ids.begin() + len), k % 2 == 1, 4 + k % 5);
}

// The group's request beside `ordinary` others (their tokens in *beside),
// its holder failing at query `fail_at` (-1: never); both engines' blocks
// are all free again at the end.
Collected RunGroup(bool seeded, int ordinary, std::vector<Collected>* beside,
                   int64_t fail_at = -1) {
  const std::vector<int32_t> ids = ChatIds();
  auto holder = MakeEngine();
  auto master = MakeEngine();
  const int free_holder = holder->scheduler().kv_cache().num_free_blocks();
  const int free_master = master->scheduler().kv_cache().num_free_blocks();
  beside->assign(ordinary, Collected());
  for (int k = 0; k < ordinary; ++k) {
    REQUIRE(master->AddRequest(Ordinary(k, ids), Collect(&(*beside)[k])).ok());
  }
  master->Step().IgnoreError();  // the others are under way first
  Collected group;
  const int64_t split = static_cast<int64_t>(ids.size()) / 2 / kBlock * kBlock;
  auto peers = StartGroup(*holder, *master, Request("group", ids, seeded, 12), split, &group);
  peers->fail_at = fail_at;
  CHECK(master->num_held_spans() == 0);  // the span is the request's now
  int mixed = 0;                         // steps that decoded the group's request beside others
  for (int steps = 0; master->has_unfinished(); ++steps) {
    REQUIRE(steps < 5000);
    const scheduler::Scheduler& s = master->scheduler();
    if (s.num_mastering() > 0 && s.num_running() > 0) ++mixed;
    REQUIRE(master->Step().ok());
  }
  CHECK((mixed > 0) == (ordinary > 0));
  CHECK(master->num_held_spans() == 0);
  CHECK(master->scheduler().kv_cache().stats().num_used_blocks == 0);
  REQUIRE(holder->ReleaseSpan("group").ok());
  CHECK(holder->scheduler().kv_cache().num_free_blocks() == free_holder);
  // Blocks the prefix cache keeps are free (evictable) too.
  CHECK(master->scheduler().kv_cache().num_free_blocks() == free_master);
  return group;
}

Collected Alone(const EngineRequest& r) {
  auto e = MakeEngine();
  Collected c;
  REQUIRE(e->AddRequest(r, Collect(&c)).ok());
  RunToEnd(*e);
  return c;
}

void CheckBeside(bool seeded, int ordinary) {
  std::vector<Collected> none, beside;
  const Collected alone = RunGroup(seeded, 0, &none);
  CHECK(alone.tokens.size() == 12);
  CHECK(alone.finish == FinishReason::kLength);
  const Collected group = RunGroup(seeded, ordinary, &beside);
  CHECK(group.tokens == alone.tokens);
  CHECK(group.text == alone.text);
  CHECK(group.finish == FinishReason::kLength);
  const std::vector<int32_t> ids = ChatIds();
  for (int k = 0; k < ordinary; ++k) {
    INFO("ordinary " << k);
    const Collected want = Alone(Ordinary(k, ids));
    CHECK(beside[k].tokens == want.tokens);
    CHECK(beside[k].text == want.text);
    CHECK(beside[k].finish == want.finish);
  }
}

Collected Alone(const EngineRequest& r);

TEST_CASE("the group's first token goes through the engine's sampling and emit path",
          "[engine][elastic]") {
  const std::vector<int32_t> ids = ChatIds();
  for (bool seeded : {false, true}) {
    for (int n : {1, 5}) {
      INFO((seeded ? "seeded" : "greedy") << ", max_tokens " << n);
      const EngineRequest request = Request("first", ids, seeded, n);
      const Collected alone = Alone(request);
      REQUIRE(alone.tokens.size() == static_cast<size_t>(n));
      auto sampler = MakeEngine();
      const int free_blocks = sampler->scheduler().kv_cache().num_free_blocks();
      std::vector<float> logits;
      std::unique_ptr<ElasticRequest> r = PrefillAlone(*sampler, request, &logits);
      // The sampler: role both's first token, its text, and its finish.
      auto event = sampler->FirstElasticToken(*r, {.logits = absl::MakeSpan(logits)});
      REQUIRE(event.ok());
      CHECK(event->token_ids == std::vector<int32_t>{alone.tokens[0]});
      CHECK(event->finish_reason == (n == 1 ? FinishReason::kLength : FinishReason::kNone));
      if (n == 1) CHECK(event->text == alone.text);
      CHECK(alone.text.rfind(event->text, 0) == 0);
      CHECK(event->completion_tokens == 1);
      const ElasticRequest::MasterState state = r->ExportState();
      CHECK(state.generated == std::vector<int32_t>{alone.tokens[0]});
      CHECK(state.draws == (seeded ? 1u : 0u));
      CHECK(sampler->FirstElasticToken(*r, {.logits = absl::MakeSpan(logits)}).status().code() ==
            absl::StatusCode::kFailedPrecondition);
      // A member that takes it: no token of its own on its stream, the same
      // finish, the same random stream.
      auto other = MakeEngine();
      auto taken = other->PrepareElastic(request);
      REQUIRE(taken.ok());
      CHECK(other->FirstElasticToken(**taken, {.token = -1}).status().code() ==
            absl::StatusCode::kInvalidArgument);
      auto took = other->FirstElasticToken(**taken, {.token = alone.tokens[0]});
      REQUIRE(took.ok());
      CHECK(took->token_ids.empty());
      CHECK(took->text.empty());
      CHECK(took->finish_reason == event->finish_reason);
      const ElasticRequest::MasterState taken_state = (*taken)->ExportState();
      CHECK(taken_state.generated == state.generated);
      CHECK(taken_state.draws == state.draws);
      if (seeded) CHECK(taken_state.seed == state.seed);
      REQUIRE(sampler->ReleaseSpan("first").ok());
      CHECK(sampler->scheduler().kv_cache().num_free_blocks() == free_blocks);
    }
  }
}

// The sampler's first-token event of `request` and a member's that took it,
// each on an engine of its own.
std::pair<StreamEvent, StreamEvent> FirstEvents(const EngineRequest& request) {
  auto sampler = MakeEngine();
  std::vector<float> logits;
  std::unique_ptr<ElasticRequest> r = PrefillAlone(*sampler, request, &logits);
  auto event = sampler->FirstElasticToken(*r, {.logits = absl::MakeSpan(logits)});
  REQUIRE(event.ok());
  REQUIRE(event->token_ids.size() == 1);
  auto other = MakeEngine();
  auto taken = other->PrepareElastic(request);
  REQUIRE(taken.ok());
  auto took = other->FirstElasticToken(**taken, {.token = event->token_ids[0]});
  REQUIRE(took.ok());
  CHECK(took->token_ids.empty());
  CHECK(took->text.empty());
  return {*event, *took};
}

TEST_CASE("a first token that is a stop id ends the group's request", "[engine][elastic]") {
  const std::vector<int32_t> ids = ChatIds();
  EngineRequest request = Request("stop", ids, false, 5);
  request.sampling.min_tokens = 0;
  EngineRequest one = request;
  one.sampling.max_tokens = 1;
  const Collected first = Alone(one);
  REQUIRE(first.tokens.size() == 1);
  request.sampling.stop_token_ids = {first.tokens[0]};
  const Collected alone = Alone(request);
  CHECK(alone.finish == FinishReason::kStop);
  const auto [event, took] = FirstEvents(request);
  CHECK(event.finish_reason == FinishReason::kStop);
  CHECK(event.text == alone.text);
  CHECK(took.finish_reason == FinishReason::kStop);
}

TEST_CASE("a group request and ordinary ones in one batch get the tokens each gets alone",
          "[engine][elastic]") {
  for (bool seeded : {false, true}) {
    INFO((seeded ? "seeded" : "greedy"));
    CheckBeside(seeded, 3);
  }
}

TEST_CASE("a group request decoding beside 16 ordinary ones: tokens as alone, nothing leaks",
          "[engine][elastic]") {
  CheckBeside(true, 16);
}

TEST_CASE("a holder that fails ends the group's request only", "[engine][elastic]") {
  std::vector<Collected> beside;
  const int layers = MakeEngine()->config().text.num_hidden_layers;
  // Fails in the third decode step's first layer.
  const Collected group = RunGroup(false, 4, &beside, 2 * layers);
  CHECK(group.finish == FinishReason::kAbort);
  CHECK(group.error.code() == absl::StatusCode::kUnavailable);
  CHECK(group.tokens.size() == 3);  // the sampler's and two decoded
  const std::vector<int32_t> ids = ChatIds();
  for (int k = 0; k < 4; ++k) {
    INFO("ordinary " << k);
    CHECK(beside[k].tokens == Alone(Ordinary(k, ids)).tokens);
  }
}

// The group's request whose master reserves one block of its decode at a
// time (growing its span whenever it has no slot left), on a master pool
// with `free_blocks` free once the group started (-1: all it has): its
// tokens, how many times its span grew, and both engines' blocks all free
// again at the end.
struct Grown {
  Collected group;
  int grows = 0;
};
Grown RunGrowing(bool seeded, int free_blocks) {
  const std::vector<int32_t> ids = ChatIds();
  auto holder = MakeEngine();
  auto master = MakeEngine();
  const int free_holder = holder->scheduler().kv_cache().num_free_blocks();
  const int free_master = master->scheduler().kv_cache().num_free_blocks();
  Grown out;
  const int64_t split = static_cast<int64_t>(ids.size()) / 2 / kBlock * kBlock;
  const int64_t len = static_cast<int64_t>(ids.size());
  // Room for the first decoded token's KV only (index len).
  auto peers = StartGroup(*holder, *master, Request("group", ids, seeded, 12), split, &out.group,
                          /*room=*/1);
  if (free_blocks >= 0) {
    const int filler = master->scheduler().kv_cache().num_free_blocks() - free_blocks;
    REQUIRE(master->HoldSpan("filler", filler * kBlock).ok());
  }
  // A kv_end inside the span grows nothing: its blocks as they are.
  auto blocks = master->GrowMasterSpan("group", split + 1);
  REQUIRE(blocks.ok());
  CHECK(static_cast<int64_t>(blocks->size()) == (len - split + 1 + kBlock - 1) / kBlock);
  for (int steps = 0; master->has_unfinished(); ++steps) {
    REQUIRE(steps < 5000);
    if (master->MasterSpanFull("group")) {
      const int64_t reserved_end = split + static_cast<int64_t>(blocks->size()) * kBlock;
      blocks = master->GrowMasterSpan("group", reserved_end + kBlock);
      if (!blocks.ok()) {
        // Nothing reserved is left and the pool has no block: it ended.
        REQUIRE(blocks.status().code() == absl::StatusCode::kResourceExhausted);
        CHECK_FALSE(master->has_unfinished());
        break;
      }
      ++out.grows;
    }
    REQUIRE(master->Step().ok());
  }
  CHECK_FALSE(master->has_unfinished());
  CHECK(master->GrowMasterSpan("group", len + 20).status().code() == absl::StatusCode::kNotFound);
  if (free_blocks >= 0) REQUIRE(master->ReleaseSpan("filler").ok());
  CHECK(master->num_held_spans() == 0);
  REQUIRE(holder->ReleaseSpan("group").ok());
  CHECK(holder->scheduler().kv_cache().num_free_blocks() == free_holder);
  CHECK(master->scheduler().kv_cache().num_free_blocks() == free_master);
  return out;
}

TEST_CASE("a master that reserves a block at a time decodes past it as its span grows",
          "[engine][elastic]") {
  for (bool seeded : {false, true}) {
    INFO((seeded ? "seeded" : "greedy"));
    std::vector<Collected> none;
    const Collected whole = RunGroup(seeded, 0, &none);  // the whole decode reserved
    const Grown grown = RunGrowing(seeded, -1);
    CHECK(grown.grows >= 2);
    CHECK(grown.group.tokens == whole.tokens);
    CHECK(grown.group.text == whole.text);
    CHECK(grown.group.finish == FinishReason::kLength);
    CHECK(grown.group.error.ok());
  }
}

TEST_CASE("a master whose span cannot grow ends its request RESOURCE_EXHAUSTED, nothing leaks",
          "[engine][elastic]") {
  std::vector<Collected> none;
  const Collected whole = RunGroup(false, 0, &none);
  const Grown grown = RunGrowing(false, /*free_blocks=*/1);  // one block more, then none
  CHECK(grown.grows == 1);
  CHECK(grown.group.finish == FinishReason::kAbort);
  CHECK(grown.group.error.code() == absl::StatusCode::kResourceExhausted);
  // It decoded what it reserved, each token as with the whole decode reserved.
  REQUIRE(grown.group.tokens.size() < whole.tokens.size());
  CHECK(grown.group.tokens.size() > 1);
  CHECK(std::equal(grown.group.tokens.begin(), grown.group.tokens.end(), whole.tokens.begin()));
}

}  // namespace
}  // namespace mmserve::worker
