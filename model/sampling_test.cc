#include "model/sampling.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <vector>

namespace mmserve::model {
namespace {

std::vector<float> LogitsFromProbs(std::vector<double> probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

std::map<int32_t, int> Draw(const std::vector<float>& logits, const SamplingParams& p, int n) {
  SamplerState state(p.seed);
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) ++counts[Sample(logits, p, &state).token];
  return counts;
}

TEST_CASE("greedy takes the argmax and the lowest id among ties", "[sampling]") {
  SamplingParams p;
  p.temperature = 0;
  SamplerState s(0);
  CHECK(Sample(std::vector<float>{0.1f, 3.0f, -1.0f, 3.0f}, p, &s).token == 1);
  p.temperature = 1;
  p.top_k = 1;  // also greedy
  CHECK(Sample(std::vector<float>{0.1f, 3.0f, 5.0f}, p, &s).token == 2);
}

TEST_CASE("temperature 1 samples the softmax distribution", "[sampling]") {
  SamplingParams p;
  p.seed = 7;
  const int n = 40000;
  auto counts = Draw(LogitsFromProbs({0.6, 0.3, 0.1}), p, n);
  CHECK(counts[0] / double(n) == Approx(0.6).margin(0.015));
  CHECK(counts[1] / double(n) == Approx(0.3).margin(0.015));
  CHECK(counts[2] / double(n) == Approx(0.1).margin(0.015));
}

TEST_CASE("a low temperature sharpens the distribution", "[sampling]") {
  SamplingParams p;
  p.temperature = 0.25f;  // p^4 renormalised: 0.6^4 / (0.6^4 + 0.3^4 + 0.1^4) ~ 0.94
  p.seed = 3;
  auto counts = Draw(LogitsFromProbs({0.6, 0.3, 0.1}), p, 20000);
  CHECK(counts[0] / 20000.0 == Approx(0.9412).margin(0.01));
}

TEST_CASE("top-k, top-p and min-p never sample outside their sets", "[sampling]") {
  auto logits = LogitsFromProbs({0.5, 0.3, 0.15, 0.05});
  SamplingParams k;
  k.top_k = 2;
  k.seed = 1;
  auto ck = Draw(logits, k, 5000);
  CHECK(ck.count(2) == 0);
  CHECK(ck.count(3) == 0);
  CHECK(ck[0] / 5000.0 == Approx(0.625).margin(0.03));  // 0.5 / 0.8

  SamplingParams tp;
  tp.top_p = 0.85f;  // 0.5 + 0.3 = 0.8 < 0.85: the third token is needed too
  tp.seed = 2;
  auto cp = Draw(logits, tp, 5000);
  CHECK(cp.count(3) == 0);
  CHECK(cp.count(2) == 1);

  SamplingParams mp;
  mp.min_p = 0.5f;  // floor 0.25: tokens 0 and 1
  mp.seed = 3;
  auto cm = Draw(logits, mp, 5000);
  CHECK(cm.size() == 2);
  CHECK(cm.count(2) == 0);
}

TEST_CASE("the same seed gives the same tokens, another seed other tokens", "[sampling]") {
  std::vector<float> logits(1000);
  for (int i = 0; i < 1000; ++i) logits[i] = std::sin(i * 0.37f);
  auto run = [&](uint64_t seed) {
    SamplingParams p;
    p.seed = seed;
    SamplerState s(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) out.push_back(Sample(logits, p, &s).token);
    return out;
  };
  CHECK(run(11) == run(11));
  CHECK(run(11) != run(12));
}

TEST_CASE("logprobs come from the raw logits, most likely first", "[sampling]") {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 2;
  SamplerState s(0);
  SampleResult r = Sample(LogitsFromProbs({0.2, 0.5, 0.3}), p, &s);
  CHECK(r.token == 1);
  CHECK(r.logprob == Approx(std::log(0.5)).margin(1e-5));
  REQUIRE(r.top.size() == 2);
  CHECK(r.top[0].token == 1);
  CHECK(r.top[1].token == 2);
  CHECK(r.top[1].logprob == Approx(std::log(0.3)).margin(1e-5));
}

TEST_CASE("invalid sampling parameters are rejected with the field named", "[sampling]") {
  struct Case {
    const char* what;
    void (*edit)(SamplingParams&);
    const char* expect;
  };
  const Case cases[] = {
      {"temperature", [](SamplingParams& p) { p.temperature = -0.5f; }, "temperature"},
      {"nan temperature", [](SamplingParams& p) { p.temperature = NAN; }, "temperature"},
      {"top_p zero", [](SamplingParams& p) { p.top_p = 0; }, "top_p"},
      {"top_p above 1", [](SamplingParams& p) { p.top_p = 1.5f; }, "top_p"},
      {"top_k", [](SamplingParams& p) { p.top_k = -1; }, "top_k"},
      {"min_p", [](SamplingParams& p) { p.min_p = 2; }, "min_p"},
      {"max_tokens", [](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens"},
      {"min_tokens", [](SamplingParams& p) { p.min_tokens = 100; }, "min_tokens"},
      {"logprobs", [](SamplingParams& p) { p.logprobs = 21; }, "logprobs"},
      {"stop count", [](SamplingParams& p) { p.stop.assign(17, "x"); }, "stop strings"},
      {"empty stop", [](SamplingParams& p) { p.stop = {""}; }, "stop strings"},
      {"stop id", [](SamplingParams& p) { p.stop_token_ids = {5000}; }, "stop_token_ids"},
      {"presence above 2", [](SamplingParams& p) { p.presence_penalty = 2.5f; },
       "presence_penalty"},
      {"presence nan", [](SamplingParams& p) { p.presence_penalty = NAN; }, "presence_penalty"},
      {"frequency below -2", [](SamplingParams& p) { p.frequency_penalty = -2.01f; },
       "frequency_penalty"},
      {"repetition zero", [](SamplingParams& p) { p.repetition_penalty = 0; },
       "repetition_penalty"},
      {"repetition inf", [](SamplingParams& p) { p.repetition_penalty = INFINITY; },
       "repetition_penalty"},
      {"bias token",
       [](SamplingParams& p) {
         p.logit_bias = {{1000, 1}};
       },
       "logit_bias: token"},
      {"bias value",
       [](SamplingParams& p) {
         p.logit_bias = {{3, 101}};
       },
       "[-100, 100]"},
      {"bias order",
       [](SamplingParams& p) {
         p.logit_bias = {{3, 1}, {3, 2}};
       },
       "sorted"},
  };
  CHECK(ValidateSamplingParams(SamplingParams(), 1000).ok());
  for (const Case& c : cases) {
    INFO(c.what);
    SamplingParams p;
    c.edit(p);
    absl::Status s = ValidateSamplingParams(p, 1000);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find(c.expect) != absl::string_view::npos);
  }
}

// transformers' RepetitionPenaltyLogitsProcessor and OpenAI's presence and
// frequency penalties, written out here on their own, in vLLM's order after
// the logit bias.
std::vector<float> Reference(std::vector<float> logits, const SamplingParams& p,
                             const std::vector<int32_t>& prompt,
                             const std::vector<int32_t>& output) {
  for (const TokenBias& b : p.logit_bias) logits[b.token] += b.bias;
  std::vector<float> gathered = logits;  // torch.gather before scatter
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), output.begin(), output.end());
  for (int32_t t : all) {
    const float v = gathered[t];
    logits[t] = v < 0 ? v * p.repetition_penalty : v / p.repetition_penalty;
  }
  std::map<int32_t, int> counts;
  for (int32_t t : output) ++counts[t];
  for (const auto& [t, c] : counts) {
    logits[t] -= p.frequency_penalty * static_cast<float>(c);
    logits[t] -= p.presence_penalty;
  }
  return logits;
}

TEST_CASE("penalties and logit_bias match the reference formulas", "[sampling]") {
  std::vector<float> logits(64);
  for (int i = 0; i < 64; ++i) logits[i] = 3.0f * std::sin(i * 0.9f);
  const std::vector<int32_t> prompt = {1, 2, 2, 5, 7, 40};
  const std::vector<int32_t> output = {7, 9, 9, 9, 12, 2};
  SamplingParams p;
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.4f;
  p.presence_penalty = -0.7f;
  p.logit_bias = {{5, -2.5f}, {9, 1.0f}, {63, 100.0f}};
  REQUIRE(ValidateSamplingParams(p, 64).ok());
  std::vector<float> got = logits;
  ApplyLogitsProcessors(absl::MakeSpan(got), p, prompt, output);
  const std::vector<float> want = Reference(logits, p, prompt, output);
  for (int i = 0; i < 64; ++i) {
    INFO("token " << i);
    CHECK(got[i] == Approx(want[i]).margin(1e-6));
  }
  // Tokens neither seen nor biased are untouched.
  CHECK(got[20] == logits[20]);
  // A token seen three times in the output: the frequency term counts them.
  const float r9 = logits[9] + 1.0f;
  CHECK(got[9] == Approx((r9 > 0 ? r9 / 1.3f : r9 * 1.3f) - 3 * 0.4f + 0.7f));
}

TEST_CASE("neutral penalties change nothing", "[sampling]") {
  SamplingParams p;
  CHECK_FALSE(p.processes_logits());
  std::vector<float> logits = {0.5f, -1.0f, 2.0f};
  std::vector<float> got = logits;
  ApplyLogitsProcessors(absl::MakeSpan(got), p, std::vector<int32_t>{0, 1},
                        std::vector<int32_t>{2});
  CHECK(got == logits);
}

TEST_CASE("logit_bias -100 bans a token and +100 forces it, greedy and sampled", "[sampling]") {
  std::vector<float> logits = {5.0f, 1.0f, 0.0f, -1.0f};
  for (float temperature : {0.0f, 1.0f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.seed = 4;
    p.logit_bias = {{0, -100.0f}, {3, 100.0f}};
    SamplerState s(p.seed);
    for (int i = 0; i < 200; ++i) {
      std::vector<float> processed = logits;
      ApplyLogitsProcessors(absl::MakeSpan(processed), p, {}, {});
      CHECK(Sample(logits, processed, p, &s).token == 3);
    }
  }
}

TEST_CASE("a repetition penalty steers greedy decoding off a repeated token", "[sampling]") {
  // Token 0 leads by a little; once it was seen, a penalty of 2 halves it.
  std::vector<float> logits = {2.0f, 1.5f, 0.1f};
  SamplingParams p;
  p.temperature = 0;
  SamplerState s(0);
  CHECK(Sample(logits, p, &s).token == 0);
  p.repetition_penalty = 2.0f;
  std::vector<float> processed = logits;
  ApplyLogitsProcessors(absl::MakeSpan(processed), p, std::vector<int32_t>{0}, {});
  CHECK(Sample(logits, processed, p, &s).token == 1);
  // A negative logit seen is pushed further down (multiplied), not raised.
  std::vector<float> negative = {-1.0f, -1.5f};
  ApplyLogitsProcessors(absl::MakeSpan(negative), p, std::vector<int32_t>{0}, {});
  CHECK(negative[0] == -2.0f);
}

TEST_CASE("with penalties, log probabilities stay those of the raw logits", "[sampling]") {
  std::vector<float> logits = LogitsFromProbs({0.2, 0.5, 0.3});
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 1;
  p.logit_bias = {{0, 50.0f}};
  std::vector<float> processed = logits;
  ApplyLogitsProcessors(absl::MakeSpan(processed), p, {}, {});
  SamplerState s(0);
  SampleResult r = Sample(logits, processed, p, &s);
  CHECK(r.token == 0);
  CHECK(r.logprob == Approx(std::log(0.2)).margin(1e-5));
  REQUIRE(r.top.size() == 1);
  CHECK(r.top[0].token == 1);
}

TEST_CASE("penalised seeded sampling is deterministic and draws once per token", "[sampling]") {
  std::vector<float> logits(200);
  for (int i = 0; i < 200; ++i) logits[i] = std::cos(i * 0.21f);
  auto run = [&](float frequency) {
    SamplingParams p;
    p.seed = 99;
    p.frequency_penalty = frequency;
    SamplerState s(p.seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 60; ++i) {
      std::vector<float> processed = logits;
      ApplyLogitsProcessors(absl::MakeSpan(processed), p, {}, out);
      out.push_back(Sample(logits, processed, p, &s).token);
    }
    return out;
  };
  CHECK(run(1.5f) == run(1.5f));
  CHECK(run(1.5f) != run(0.0f));
  // A strong frequency penalty spreads the choice: more distinct tokens.
  auto distinct = [](std::vector<int32_t> v) {
    std::sort(v.begin(), v.end());
    return std::unique(v.begin(), v.end()) - v.begin();
  };
  CHECK(distinct(run(2.0f)) > distinct(run(0.0f)));
}

}  // namespace
}  // namespace mmserve::model
