#include "model/qwen2_golden_testing.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

namespace mmserve::model {

nlohmann::json ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

LoadedModel LoadTestModel(const std::string& name, const Qwen2WeightsOptions& options) {
  return LoadModelDir("model/testdata/models/" + name, options);
}

LoadedModel OpenModelDir(const std::string& dir) {
  LoadedModel m;
  auto cfg = LoadModelConfig(dir);
  REQUIRE(cfg.ok());
  m.cfg = *cfg;
  auto ckpt = SafetensorsCheckpoint::Open(dir);
  REQUIRE(ckpt.ok());
  m.ckpt = std::move(ckpt).value();
  return m;
}

LoadedModel LoadModelDir(const std::string& dir, const Qwen2WeightsOptions& options) {
  LoadedModel m = OpenModelDir(dir);
  auto w = Qwen2Weights::Load(*m.ckpt, m.cfg.text, options);
  INFO(w.status().ToString());
  REQUIRE(w.ok());
  m.weights = std::move(w).value();
  return m;
}

float MaxAbsDiff(const std::vector<float>& a, const float* b) {
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

std::vector<int32_t> GreedyTokens(TestRunner& runner, int seq, std::vector<float> last, size_t n,
                                  const std::vector<int>& masked) {
  std::vector<int32_t> got;
  for (size_t i = 0; i < n; ++i) {
    got.push_back(GreedyToken(last, masked));
    runner.Append(seq, got.back());
    if (i + 1 == n) break;
    auto next = runner.Step({{seq, 1}});
    REQUIRE(next.ok());
    last = (*next)[0][0];
  }
  return got;
}

size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t same = 0;
  while (same < a.size() && same < b.size() && a[same] == b[same]) ++same;
  return same;
}

size_t StepsBeforeNearTie(const std::vector<float>& margins, float bound) {
  size_t steps = 0;
  while (steps < margins.size() && margins[steps] > bound) ++steps;
  return steps;
}

void CheckBatchInvariance(Qwen2Model& model) {
  const std::vector<int32_t> a = {5, 17, 300, 42, 7, 99, 1000, 3};
  const std::vector<int32_t> b = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21};
  TestRunner alone(model, 64, 4), together(model, 64, 4);
  const int sa = alone.AddSequence(a);
  const int ta = together.AddSequence(a), tb = together.AddSequence(b);
  auto one = alone.Step({{sa, 8}});
  auto both = together.Step({{tb, 11}, {ta, 8}});
  REQUIRE(one.ok());
  REQUIRE(both.ok());
  const std::vector<float>& x = (*one)[0].back();
  const std::vector<float>& y = (*both)[1].back();
  REQUIRE(x.size() == y.size());
  CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  // A decode step next to another sequence's.
  alone.Append(sa, 77);
  together.Append(ta, 77);
  together.Append(tb, 78);
  auto one2 = alone.Step({{sa, 1}});
  auto both2 = together.Step({{ta, 1}, {tb, 1}});
  REQUIRE(one2.ok());
  REQUIRE(both2.ok());
  CHECK(std::memcmp((*one2)[0][0].data(), (*both2)[0][0].data(), x.size() * sizeof(float)) == 0);
}

std::vector<float> F32Tensor(const SafetensorsFile& f, const std::string& name) {
  const TensorView* t = f.Find(name);
  INFO(name);
  REQUIRE(t != nullptr);
  REQUIRE(t->dtype == DType::kF32);
  std::vector<float> v(t->numel());
  std::memcpy(v.data(), t->data, t->nbytes);
  return v;
}

GoldenSequence::GoldenSequence(Qwen2Model& model, int64_t capacity) : model_(model) {
  auto kv = KvCache::Create(model.KvShape(capacity / kBlock + 1, kBlock));
  REQUIRE(kv.ok());
  kv_ = std::move(*kv);
  for (int32_t b = 0; b <= capacity / kBlock; ++b) blocks_.push_back(b);
}

std::vector<float> GoldenSequence::Step(const std::vector<int32_t>& ids,
                                        const std::vector<int64_t>& pos,
                                        std::vector<EmbeddingOverride> overrides) {
  ForwardBatch b;
  b.token_ids = ids;
  b.positions = pos;
  const int64_t n = static_cast<int64_t>(ids.size());
  for (int64_t i = 0; i < n; ++i) b.slot_mapping.push_back(len_ + i);
  len_ += n;
  b.sequences.push_back({0, n, len_, blocks_});
  b.logits_rows = {n - 1};
  b.embedding_overrides = std::move(overrides);
  std::vector<float> logits;
  const absl::Status s = model_.Forward(b, *kv_, &logits);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return logits;
}

}  // namespace mmserve::model
