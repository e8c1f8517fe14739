// The engine's penalties and logit_bias against a reference written here:
// the model's own logits (prefill, then one decode step per token, through
// the test runner), transformers' RepetitionPenaltyLogitsProcessor and
// OpenAI's presence and frequency penalties applied by the formulas below,
// then argmax, or model::Sample with the request's seed. Requests run
// batched beside others with other parameters, so the result must not
// depend on the batch.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/cpu/thread_pool.h"
#include "model/qwen2_golden_testing.h"
#include "model/sampling.h"
#include "worker/engine.h"

namespace mmserve::worker {
namespace {

constexpr char kModel[] = "qwen2vl-tiny-mha-tied";
constexpr int kTokens = 24;

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

std::vector<std::vector<int32_t>> Prompts() {
  nlohmann::json g =
      model::ReadJsonFile(std::string("model/testdata/goldens/") + kModel + "/lm_golden.json");
  std::vector<std::vector<int32_t>> prompts;
  for (const nlohmann::json& p : g["prompts"]) {
    if (p["compute_dtype"] != "fp32") continue;
    prompts.push_back(p["input_ids"].get<std::vector<int32_t>>());
  }
  REQUIRE(prompts.size() >= 3);
  return prompts;
}

// The processing, written from the formulas: logit_bias added; every
// distinct token of prompt + output divided (positive) or multiplied
// (negative) by the repetition penalty; each token generated c times lowered
// by c * frequency + presence.
void Process(std::vector<float>& logits, const model::SamplingParams& p,
             const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
  for (const model::TokenBias& b : p.logit_bias) logits[b.token] += b.bias;
  std::vector<bool> seen(logits.size());
  for (const std::vector<int32_t>* ids : {&prompt, &output}) {
    for (int32_t t : *ids) seen[t] = true;
  }
  for (size_t t = 0; t < logits.size(); ++t) {
    if (!seen[t]) continue;
    logits[t] = logits[t] < 0 ? logits[t] * p.repetition_penalty : logits[t] / p.repetition_penalty;
  }
  std::map<int32_t, int> count;
  for (int32_t t : output) ++count[t];
  for (const auto& [t, c] : count) {
    logits[t] -= p.frequency_penalty * static_cast<float>(c);
    logits[t] -= p.presence_penalty;
  }
}

// kTokens tokens of `prompt` under p, the model run alone, token by token.
std::vector<int32_t> Reference(model::Qwen2Model& model, const std::vector<int32_t>& prompt,
                               const model::SamplingParams& p) {
  model::TestRunner runner(model, /*num_blocks=*/128, /*block_size=*/4);
  const int s = runner.AddSequence(prompt);
  auto step = runner.Step({{s, static_cast<int64_t>(prompt.size())}});
  REQUIRE(step.ok());
  std::vector<float> raw = (*step)[0].back();
  model::SamplerState sampler(p.seed);
  std::vector<int32_t> out;
  while (true) {
    std::vector<float> processed = raw;
    Process(processed, p, prompt, out);
    int32_t token = 0;
    if (p.greedy()) {
      token = static_cast<int32_t>(std::max_element(processed.begin(), processed.end()) -
                                   processed.begin());
    } else {
      token = model::Sample(raw, processed, p, &sampler).token;
    }
    out.push_back(token);
    if (static_cast<int>(out.size()) == kTokens) return out;
    runner.Append(s, token);
    auto next = runner.Step({{s, 1}});
    REQUIRE(next.ok());
    raw = (*next)[0][0];
  }
}

model::SamplingParams Base(float temperature, uint64_t seed) {
  model::SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  p.max_tokens = kTokens;
  p.ignore_eos = true;  // kTokens each, eos not masked
  return p;
}

struct Case {
  const char* name;
  model::SamplingParams params;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  cases.push_back({"greedy, no processing", Base(0, 0)});
  model::SamplingParams rep = Base(0, 0);
  rep.repetition_penalty = 1.8f;
  cases.push_back({"greedy, repetition 1.8", rep});
  model::SamplingParams rep_low = Base(0, 0);
  rep_low.repetition_penalty = 0.6f;
  cases.push_back({"greedy, repetition 0.6 (rewards repeats)", rep_low});
  model::SamplingParams freq = Base(0, 0);
  freq.frequency_penalty = 2.0f;
  freq.presence_penalty = 0.5f;
  cases.push_back({"greedy, frequency 2 and presence 0.5", freq});
  model::SamplingParams neg = Base(0, 0);
  neg.presence_penalty = -2.0f;
  cases.push_back({"greedy, presence -2", neg});
  model::SamplingParams bias = Base(0, 0);
  bias.logit_bias = {{5, 8.0f}, {17, -100.0f}, {40, 3.0f}};
  cases.push_back({"greedy, logit_bias", bias});
  model::SamplingParams all = Base(0.8f, 1234);
  all.repetition_penalty = 1.3f;
  all.frequency_penalty = 0.7f;
  all.presence_penalty = 0.3f;
  all.logit_bias = {{3, 2.0f}, {9, -4.0f}};
  cases.push_back({"sampled under seed 1234, everything", all});
  model::SamplingParams sampled = Base(1.0f, 77);
  sampled.frequency_penalty = 1.0f;
  sampled.top_k = 20;
  cases.push_back({"sampled under seed 77, frequency 1, top_k 20", sampled});
  return cases;
}

struct Collected {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
};

TEST_CASE("penalties and logit_bias equal the reference formulas over the model's logits",
          "[engine][sampling]") {
  model::LoadedModel m = model::LoadTestModel(kModel);
  model::cpu::ThreadPool pool(2);
  model::Qwen2Model model(m.cfg.text, *m.weights, pool);
  const std::vector<std::vector<int32_t>> prompts = Prompts();
  const std::vector<Case> cases = Cases();

  // Every case on every prompt, all in one engine: batched with each other.
  auto engine = MakeEngine();
  std::map<std::string, Collected> got;
  for (size_t c = 0; c < cases.size(); ++c) {
    for (size_t i = 0; i < 3; ++i) {
      EngineRequest r;
      r.id = absl::StrCat(c, "/", i);
      r.prompt_token_ids = prompts[i];
      r.sampling = cases[c].params;
      Collected* out = &got[r.id];
      REQUIRE(engine
                  ->AddRequest(std::move(r),
                               [out](const StreamEvent& e) {
                                 out->tokens.insert(out->tokens.end(), e.token_ids.begin(),
                                                    e.token_ids.end());
                                 if (e.finish_reason != FinishReason::kNone) {
                                   out->finish = e.finish_reason;
                                 }
                               })
                  .ok());
    }
  }
  for (int steps = 0; engine->has_unfinished(); ++steps) {
    REQUIRE(steps < 5000);
    REQUIRE(engine->Step().ok());
  }
  std::map<std::string, std::vector<int32_t>> outputs;
  for (size_t c = 0; c < cases.size(); ++c) {
    for (size_t i = 0; i < 3; ++i) {
      const std::string id = absl::StrCat(c, "/", i);
      INFO(cases[c].name << ", prompt " << i);
      CHECK(got[id].finish == FinishReason::kLength);
      CHECK(got[id].tokens == Reference(model, prompts[i], cases[c].params));
      outputs[id] = got[id].tokens;
    }
  }
  // The parameters matter: each processed case differs from the plain one
  // on some prompt (else the check above proves nothing).
  for (size_t c = 1; c < 6; ++c) {
    INFO(cases[c].name);
    bool differs = false;
    for (size_t i = 0; i < 3; ++i) {
      differs = differs || outputs[absl::StrCat(c, "/", i)] != outputs[absl::StrCat(0, "/", i)];
    }
    CHECK(differs);
  }
  // A banned token never comes; a repetition penalty above 1 repeats less.
  for (size_t i = 0; i < 3; ++i) {
    const std::vector<int32_t>& b = outputs[absl::StrCat(5, "/", i)];
    CHECK(std::count(b.begin(), b.end(), 17) == 0);
  }
  auto distinct = [](std::vector<int32_t> v) {
    std::sort(v.begin(), v.end());
    return std::unique(v.begin(), v.end()) - v.begin();
  };
  int more = 0;
  for (size_t i = 0; i < 3; ++i) {
    more +=
        distinct(outputs[absl::StrCat(1, "/", i)]) >= distinct(outputs[absl::StrCat(0, "/", i)]);
  }
  CHECK(more == 3);
}

TEST_CASE("a seeded penalised request gives the same tokens alone and in a crowd",
          "[engine][sampling]") {
  model::SamplingParams p = Base(1.0f, 5);
  p.repetition_penalty = 1.2f;
  p.frequency_penalty = 0.5f;
  p.logit_bias = {{11, 1.5f}};
  const std::vector<std::vector<int32_t>> prompts = Prompts();
  auto run = [&](bool crowd) {
    auto engine = MakeEngine();
    Collected c;
    EngineRequest r;
    r.id = "mine";
    r.prompt_token_ids = prompts[0];
    r.sampling = p;
    REQUIRE(engine
                ->AddRequest(std::move(r),
                             [&c](const StreamEvent& e) {
                               c.tokens.insert(c.tokens.end(), e.token_ids.begin(),
                                               e.token_ids.end());
                             })
                .ok());
    if (crowd) {
      for (int i = 1; i < 3; ++i) {
        EngineRequest o;
        o.id = absl::StrCat("other", i);
        o.prompt_token_ids = prompts[i];
        o.sampling = Base(0.9f, 100 + i);
        o.sampling.presence_penalty = 1.0f;
        REQUIRE(engine->AddRequest(std::move(o), [](const StreamEvent&) {}).ok());
      }
    }
    for (int steps = 0; engine->has_unfinished(); ++steps) {
      REQUIRE(steps < 5000);
      REQUIRE(engine->Step().ok());
    }
    return c.tokens;
  };
  const std::vector<int32_t> alone = run(false);
  CHECK(alone.size() == static_cast<size_t>(kTokens));
  CHECK(run(true) == alone);
  CHECK(run(false) == alone);
}

TEST_CASE("a prompt already in the prefix cache is reported as cached prompt tokens",
          "[engine][sampling]") {
  // What the later choices of an n > 1 request rely on: started after the
  // first one sampled, they find its prompt's full blocks cached.
  auto engine = MakeEngine();
  std::vector<int32_t> prompt;
  for (const std::vector<int32_t>& p : Prompts()) prompt.insert(prompt.end(), p.begin(), p.end());
  REQUIRE(prompt.size() > 12);
  std::vector<int> cached;
  for (int round = 0; round < 2; ++round) {
    EngineRequest r;
    r.id = absl::StrCat("r", round);
    r.prompt_token_ids = prompt;
    r.sampling = Base(1.0f, 3 + round);
    REQUIRE(engine
                ->AddRequest(std::move(r),
                             [&cached](const StreamEvent& e) {
                               if (e.finish_reason != FinishReason::kNone) {
                                 cached.push_back(e.cached_prompt_tokens);
                               }
                             })
                .ok());
    while (engine->has_unfinished()) REQUIRE(engine->Step().ok());
  }
  REQUIRE(cached.size() == 2);
  CHECK(cached[0] == 0);
  // Every full block of 4 tokens, the last token always recomputed.
  CHECK(cached[1] == static_cast<int>((prompt.size() - 1) / 4 * 4));
}

TEST_CASE("the engine refuses out-of-range penalties and bias tokens", "[engine][sampling]") {
  auto engine = MakeEngine();
  auto refuse = [&](void (*edit)(model::SamplingParams&), const char* field) {
    EngineRequest r;
    r.id = "bad";
    r.prompt_token_ids = {1, 2, 3};
    r.sampling = Base(0, 0);
    edit(r.sampling);
    absl::Status s = engine->AddRequest(std::move(r), [](const StreamEvent&) {});
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find(field) != absl::string_view::npos);
  };
  refuse([](model::SamplingParams& p) { p.presence_penalty = 3; }, "presence_penalty");
  refuse([](model::SamplingParams& p) { p.repetition_penalty = -1; }, "repetition_penalty");
  refuse([](model::SamplingParams& p) { p.logit_bias = {{1 << 30, 1.0f}}; }, "logit_bias");
  CHECK_FALSE(engine->has_unfinished());
}

}  // namespace
}  // namespace mmserve::worker
