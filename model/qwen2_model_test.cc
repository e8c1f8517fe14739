#include "model/qwen2_model.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <vector>

#include "model/cpu/thread_pool.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/qwen2_test_runner.h"
#include "model/qwen2_weights.h"

namespace mmserve::model {
namespace {

TextConfig TinyConfig() {
  TextConfig cfg;
  cfg.vocab_size = 97;
  cfg.hidden_size = 48;
  cfg.intermediate_size = 80;
  cfg.num_hidden_layers = 2;
  cfg.num_attention_heads = 6;
  cfg.num_key_value_heads = 2;
  cfg.rms_norm_eps = 1e-6;
  cfg.rope_theta = 10000.0;
  cfg.mrope_section = {1, 1, 2};
  cfg.tie_word_embeddings = false;
  return cfg;
}

std::vector<int32_t> Prompt(int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 37 + 5) % 97);
  return p;
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

TEST_CASE("prefill in chunks then decode gives bitwise the logits of one long prefill", "[model]") {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    TextConfig cfg = TinyConfig();
    auto weights = Qwen2Weights::Random(cfg, dtype, 3);
    cpu::ThreadPool pool(2);
    Qwen2Model model(cfg, *weights, pool);
    const std::vector<int32_t> prompt = Prompt(13);
    TestRunner whole(model, 32, 4);
    const int a = whole.AddSequence(prompt);
    auto all = whole.Step({{a, 13}}, /*all_rows=*/true);
    REQUIRE(all.ok());
    TestRunner pieces(model, 32, 4);
    const int b = pieces.AddSequence(prompt);
    std::vector<std::vector<float>> rows;
    for (int64_t n : {5, 4, 1, 1, 1, 1}) {
      auto out = pieces.Step({{b, n}}, true);
      REQUIRE(out.ok());
      for (auto& r : (*out)[0]) rows.push_back(r);
    }
    REQUIRE(rows.size() == 13);
    for (int i = 0; i < 13; ++i) {
      INFO("dtype " << DTypeName(dtype) << " row " << i);
      CHECK(rows[i] == (*all)[0][i]);
    }
  }
}

TEST_CASE("on_layers_written reports each layer once its K/V is in the cache, in order",
          "[model]") {
  TextConfig cfg = TinyConfig();
  auto weights = Qwen2Weights::Random(cfg, DType::kF32, 3);
  cpu::ThreadPool pool(2);
  Qwen2Model model(cfg, *weights, pool);
  const KvCacheShape shape = model.KvShape(/*num_blocks=*/2, /*block_size=*/4);
  auto created = KvCache::Create(shape);  // zeroed
  REQUIRE(created.ok());
  KvCache& kv = **created;
  ForwardBatch b;
  b.token_ids = Prompt(8);
  for (int c = 0; c < 3; ++c) {
    for (int64_t i = 0; i < 8; ++i) b.positions.push_back(i);
  }
  for (int64_t i = 0; i < 8; ++i) b.slot_mapping.push_back(i);
  b.sequences = {{0, 8, 8, {0, 1}}};
  b.logits_rows = {7};
  // At each report: the layers reported hold K/V, the next one nothing yet.
  const int64_t plane = shape.LayerPlaneFloats();
  auto written = [&](int64_t layer) {
    for (int64_t i = 0; i < plane; ++i) {
      if (kv.Key(layer)[i] != 0.0f || kv.Value(layer)[i] != 0.0f) return true;
    }
    return false;
  };
  std::vector<int> reports;
  std::vector<std::vector<float>> at_report;  // the reported layer's keys then
  b.on_layers_written = [&](int layers) {
    reports.push_back(layers);
    CHECK(written(layers - 1));
    if (layers < cfg.num_hidden_layers) CHECK_FALSE(written(layers));
    at_report.emplace_back(kv.Key(layers - 1), kv.Key(layers - 1) + plane);
  };
  std::vector<float> logits;
  REQUIRE(model.Forward(b, kv, &logits).ok());
  CHECK(reports == std::vector<int>{1, 2});
  for (int l = 0; l < 2; ++l) {  // final when reported
    CHECK(at_report[l] == std::vector<float>(kv.Key(l), kv.Key(l) + plane));
  }
}

TEST_CASE("an embedding override replaces the token's embedding", "[model]") {
  TextConfig cfg = TinyConfig();
  auto weights = Qwen2Weights::Random(cfg, DType::kF32, 4);
  cpu::ThreadPool pool(2);
  Qwen2Model model(cfg, *weights, pool);
  auto kv = KvCache::Create(model.KvShape(4, 4));
  REQUIRE(kv.ok());
  ForwardBatch b;
  b.token_ids = {3, 9, 4};
  b.positions = {0, 1, 2, 0, 1, 2, 0, 1, 2};
  b.slot_mapping = {0, 1, 2};
  b.sequences = {{0, 3, 3, {0}}};
  b.logits_rows = {2};
  std::vector<float> base, same, changed;
  REQUIRE(model.Forward(b, **kv, &base).ok());
  // Overriding row 1 with token 9's own embedding changes nothing.
  const float* e9 = static_cast<const float*>(weights->embed().data) + 9 * cfg.hidden_size;
  b.embedding_overrides = {{1, e9}};
  REQUIRE(model.Forward(b, **kv, &same).ok());
  CHECK(same == base);
  // Token 9's embedding placed over an out-of-vocabulary id gives the same too.
  b.token_ids[1] = -1;
  REQUIRE(model.Forward(b, **kv, &same).ok());
  CHECK(same == base);
  std::vector<float> other(cfg.hidden_size, 0.05f);
  b.embedding_overrides = {{1, other.data()}};
  REQUIRE(model.Forward(b, **kv, &changed).ok());
  CHECK(MaxAbsDiff(changed, base) > 1e-4f);
}

TEST_CASE("distinct M-RoPE components change the result; equal ones are plain RoPE", "[model]") {
  TextConfig cfg = TinyConfig();
  auto weights = Qwen2Weights::Random(cfg, DType::kF32, 5);
  cpu::ThreadPool pool(1);
  Qwen2Model model(cfg, *weights, pool);
  auto kv = KvCache::Create(model.KvShape(4, 4));
  REQUIRE(kv.ok());
  ForwardBatch b;
  b.token_ids = {3, 9, 4};
  b.positions = {0, 1, 2, 0, 1, 2, 0, 1, 2};
  b.slot_mapping = {0, 1, 2};
  b.sequences = {{0, 3, 3, {0}}};
  b.logits_rows = {0, 1, 2};
  std::vector<float> text, vision;
  REQUIRE(model.Forward(b, **kv, &text).ok());
  b.positions = {0, 1, 1, 0, 1, 2, 0, 2, 1};  // rows 1-2 as a 2x2 image patch grid
  REQUIRE(model.Forward(b, **kv, &vision).ok());
  // Row 0 is at (0, 0, 0) in both.
  CHECK(std::vector<float>(text.begin(), text.begin() + 97) ==
        std::vector<float>(vision.begin(), vision.begin() + 97));
  CHECK(MaxAbsDiff(text, vision) > 1e-5f);
}

TEST_CASE("a malformed batch or a cache of another shape is rejected before any write", "[model]") {
  TextConfig cfg = TinyConfig();
  auto weights = Qwen2Weights::Random(cfg, DType::kF32, 6);
  cpu::ThreadPool pool(1);
  Qwen2Model model(cfg, *weights, pool);
  auto kv = KvCache::Create(model.KvShape(2, 4));
  REQUIRE(kv.ok());
  ForwardBatch b;
  b.token_ids = {3};
  b.positions = {0, 0, 0};
  b.slot_mapping = {5};  // block 0 offset 0 would be slot 0
  b.sequences = {{0, 1, 1, {0}}};
  b.logits_rows = {0};
  std::vector<float> logits;
  CHECK(model.Forward(b, **kv, &logits).code() == absl::StatusCode::kInvalidArgument);
  for (int64_t l = 0; l < 2; ++l) {
    for (int64_t i = 0; i < (*kv)->shape().LayerPlaneFloats(); ++i) {
      REQUIRE((*kv)->Key(l)[i] == 0.0f);
    }
  }
  KvCacheShape wrong = model.KvShape(2, 4);
  wrong.num_kv_heads = 3;
  auto other = KvCache::Create(wrong);
  REQUIRE(other.ok());
  b.slot_mapping = {0};
  absl::Status s = model.Forward(b, **other, &logits);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(KvCache::Create({0, 1, 1, 1, 1}).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("the OpenBLAS kernel gives the same logits to rounding", "[model]") {
  TextConfig cfg = TinyConfig();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    auto weights = Qwen2Weights::Random(cfg, dtype, 7);
    cpu::ThreadPool pool(2);
    Qwen2Model dot(cfg, *weights, pool);
    Qwen2Model blas(cfg, *weights, pool, {cpu::LinearKernel::kOpenBlas});
    TestRunner r1(dot, 8, 4), r2(blas, 8, 4);
    auto a = r1.Step({{r1.AddSequence(Prompt(9)), 9}}, true);
    auto b = r2.Step({{r2.AddSequence(Prompt(9)), 9}}, true);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    for (int i = 0; i < 9; ++i) CHECK(MaxAbsDiff((*a)[0][i], (*b)[0][i]) < 1e-5f);
  }
}

}  // namespace
}  // namespace mmserve::model

namespace mmserve::model {
namespace {

TEST_CASE("step times count a step's linear layers and attention inside its wall time", "[model]") {
  TextConfig cfg = TinyConfig();
  auto weights = Qwen2Weights::Random(cfg, DType::kF32, 3);
  cpu::ThreadPool pool(2);
  Qwen2StepTimes times;
  Qwen2Model timed(cfg, *weights, pool, {cpu::LinearKernel::kDot, nullptr, &times});
  Qwen2Model plain(cfg, *weights, pool);
  TestRunner with_times(timed, 32, 4), without(plain, 32, 4);
  const int a = with_times.AddSequence(Prompt(13));
  const int b = without.AddSequence(Prompt(13));
  const auto start = std::chrono::steady_clock::now();
  auto timed_out = with_times.Step({{a, 12}}, /*all_rows=*/true);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(timed_out.ok());
  CHECK(times.linear_seconds > 0);
  CHECK(times.attention_seconds > 0);
  CHECK(times.linear_seconds + times.attention_seconds <= wall);
  // Timing changes nothing computed.
  auto plain_out = without.Step({{b, 12}}, true);
  REQUIRE(plain_out.ok());
  CHECK(*timed_out == *plain_out);
  // Later steps (a decode of the 13th token) add to the sums.
  const Qwen2StepTimes after_prefill = times;
  REQUIRE(with_times.Step({{a, 1}}, true).ok());
  CHECK(times.linear_seconds > after_prefill.linear_seconds);
  CHECK(times.attention_seconds > after_prefill.attention_seconds);
}

}  // namespace
}  // namespace mmserve::model
