#include "model/sampling.h"

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

}  // namespace
}  // namespace mmserve::model
