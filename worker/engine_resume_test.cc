// A request resumed from the tokens it generated elsewhere
// (EngineRequest::resume_output_token_ids) goes on exactly as the
// uninterrupted run: the same later tokens, text, log probabilities, finish
// reason and usage, for greedy and seeded sampling with penalties, resumed
// after several prefixes, just before a stop string and at max_tokens - 1.
// Tokens that cannot continue the request are refused.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/sampling.h"
#include "worker/engine.h"

namespace mmserve::worker {
namespace {

constexpr char kModel[] = "qwen2vl-tiny-mha-tied";

std::unique_ptr<LlmEngine> MakeEngine() {
  EngineOptions o;
  o.model_dir = std::string("model/testdata/models/") + kModel;
  o.block_size = 4;
  o.max_num_batched_tokens = 32;
  o.max_num_seqs = 8;
  o.kv_cache_bytes = 8 << 20;
  auto e = LlmEngine::Create(o);
  INFO(e.status().ToString());
  REQUIRE(e.ok());
  return std::move(*e);
}

const std::vector<int32_t> kPrompt = {9, 41, 7, 120, 33, 5, 88, 2, 61};

// One request's events, run to its end.
std::vector<StreamEvent> Run(LlmEngine& engine, EngineRequest request) {
  std::vector<StreamEvent> events;
  absl::Status added =
      engine.AddRequest(std::move(request), [&](const StreamEvent& e) { events.push_back(e); });
  INFO(added.ToString());
  REQUIRE(added.ok());
  for (int steps = 0; engine.has_unfinished(); ++steps) {
    REQUIRE(steps < 1000);
    REQUIRE(engine.Step().ok());
  }
  REQUIRE(!events.empty());
  return events;
}

EngineRequest Request(const std::string& id, const model::SamplingParams& p) {
  EngineRequest r;
  r.id = id;
  r.prompt_token_ids = kPrompt;
  r.sampling = p;
  return r;
}

// The events from token k on (each event of a decode step carries one
// token), joined: what a client had not seen when the run was cut at k.
struct Tail {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<float> logprobs;
  FinishReason finish = FinishReason::kNone;
  std::string matched_stop;
  int completion_tokens = 0;
  int prompt_tokens = 0;
};

Tail Join(const std::vector<StreamEvent>& events, size_t from) {
  Tail t;
  size_t seen = 0;
  for (const StreamEvent& e : events) {
    const bool after = seen >= from;
    seen += e.token_ids.size();
    if (!after) {
      REQUIRE(seen <= from);  // one token an event: k falls between events
      continue;
    }
    t.tokens.insert(t.tokens.end(), e.token_ids.begin(), e.token_ids.end());
    t.text += e.text;
    for (const model::SampleResult& s : e.logprobs) t.logprobs.push_back(s.logprob);
    if (e.finish_reason != FinishReason::kNone) {
      t.finish = e.finish_reason;
      t.matched_stop = e.matched_stop;
      t.completion_tokens = e.completion_tokens;
      t.prompt_tokens = e.prompt_tokens;
    }
  }
  return t;
}

std::vector<int32_t> Tokens(const std::vector<StreamEvent>& events) {
  return Join(events, 0).tokens;
}

void CheckResumes(LlmEngine& engine, const model::SamplingParams& p,
                  const std::vector<size_t>& cuts) {
  const std::vector<StreamEvent> whole = Run(engine, Request("whole", p));
  const std::vector<int32_t> all = Tokens(whole);
  for (size_t k : cuts) {
    REQUIRE(k < all.size());
    INFO("resumed after " << k << " of " << all.size() << " tokens");
    EngineRequest r = Request(absl::StrCat("resumed-", k), p);
    r.resume_output_token_ids.assign(all.begin(), all.begin() + k);
    const Tail got = Join(Run(engine, std::move(r)), 0);
    const Tail want = Join(whole, k);
    CHECK(got.tokens == want.tokens);
    CHECK(got.text == want.text);
    CHECK(got.logprobs == want.logprobs);
    CHECK(got.finish == want.finish);
    CHECK(got.matched_stop == want.matched_stop);
    CHECK(got.completion_tokens == want.completion_tokens);
    CHECK(got.prompt_tokens == want.prompt_tokens);
  }
}

model::SamplingParams Params(float temperature, uint64_t seed) {
  model::SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  p.max_tokens = 14;
  p.ignore_eos = true;
  p.logprobs = 2;
  return p;
}

TEST_CASE("a greedy request resumed after k tokens streams the uninterrupted run's rest",
          "[engine][resume]") {
  auto engine = MakeEngine();
  model::SamplingParams p = Params(0, 0);
  p.frequency_penalty = 0.8f;  // counts the resumed tokens as outputs
  CheckResumes(*engine, p, {1, 2, 5, 9, 13});
}

TEST_CASE("a seeded request resumed after k tokens continues the same random stream",
          "[engine][resume]") {
  auto engine = MakeEngine();
  model::SamplingParams p = Params(0.9f, 4242);
  p.top_p = 0.8f;
  p.presence_penalty = 0.4f;
  p.repetition_penalty = 1.2f;
  CheckResumes(*engine, p, {1, 3, 7, 13});
  // The draws matter: the same seed without the resumed draws differs.
  model::SamplingParams other = p;
  other.seed = 4243;
  CHECK(Tokens(Run(*engine, Request("a", p))) != Tokens(Run(*engine, Request("b", other))));
}

TEST_CASE("min_tokens counts the resumed tokens", "[engine][resume]") {
  auto engine = MakeEngine();
  model::SamplingParams p = Params(0.9f, 7);
  p.ignore_eos = false;
  p.min_tokens = 6;
  CheckResumes(*engine, p, {2, 5});
}

TEST_CASE("a request resumed just before its stop string stops at the same place",
          "[engine][resume]") {
  auto engine = MakeEngine();
  const model::SamplingParams free = Params(0.9f, 99);
  const std::vector<StreamEvent> whole = Run(*engine, Request("free", free));
  // A stop string made of two tokens' text from the middle of the output.
  std::string stop;
  size_t stop_at = 0;
  for (size_t i = 6; i + 1 < whole.size() && stop.empty(); ++i) {
    const std::string s = whole[i].text + whole[i + 1].text;
    std::string before;
    for (size_t j = 0; j < i; ++j) before += whole[j].text;
    if (s.size() >= 2 && before.find(s) == std::string::npos) {
      stop = s;
      stop_at = i;
    }
  }
  REQUIRE(!stop.empty());
  model::SamplingParams p = free;
  p.stop = {stop};
  const std::vector<StreamEvent> stopped = Run(*engine, Request("stopped", p));
  REQUIRE(stopped.back().finish_reason == FinishReason::kStopString);
  // Resumed inside the held-back stop text, and at the token that ends it.
  CheckResumes(*engine, p, {stop_at, stop_at + 1, Tokens(stopped).size() - 1});
}

TEST_CASE("resume tokens that cannot continue the request are refused", "[engine][resume]") {
  auto engine = MakeEngine();
  model::SamplingParams p = Params(0, 0);
  const std::vector<int32_t> all = Tokens(Run(*engine, Request("whole", p)));
  auto refused = [&](std::vector<int32_t> tokens, model::SamplingParams sp) {
    EngineRequest r = Request("refused", sp);
    r.resume_output_token_ids = std::move(tokens);
    const absl::Status s = engine->AddRequest(std::move(r), [](const StreamEvent&) {});
    INFO(s.ToString());
    CHECK(absl::IsInvalidArgument(s));
    CHECK(!engine->has_unfinished());
  };
  refused(all, p);                                             // max_tokens reached
  refused({all[0], -1}, p);                                    // outside the vocabulary
  refused({all[0], engine->config().text.vocab_size + 3}, p);  // outside the vocabulary
  model::SamplingParams stop_id = p;
  stop_id.stop_token_ids = {all[1]};
  refused({all[0], all[1], all[2]}, stop_id);  // a stop token ended it
}

}  // namespace
}  // namespace mmserve::worker
