// The bf16-activation mode (LinearKernel::kBf16Dot: each bf16 linear layer's
// input rounded to bf16, fp32 accumulation) against transformers in
// bfloat16 and float32 on the same checkpoint (model/testdata/bf16_goldens,
// tools/bf16_goldens.py), and its batch invariance.
//
// Bounds: transformers in bfloat16 rounds every activation (residual
// stream, norms, attention, logits) to bf16; mmserve rounds only the inputs
// of the linear layers, a subset of those roundings on the same weights, so
// its logits are expected to move from the fp32 model's by no more than
// transformers' own move, bf16_logit_shift (s, measured by the script for
// each prompt): |ours - fp32| <= s. Then |ours - hf_bf16| <= |ours - fp32| +
// |fp32 - hf_bf16| <= 2 s. Greedy tokens must be those of the bfloat16
// model up to its first step whose top-2 margin is at most 2 s (past a
// near-tie either token is a correct answer and the sequences may diverge).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/cpu/linear.h"
#include "model/cpu/thread_pool.h"
#include "model/model_config.h"
#include "model/qwen2_model.h"
#include "model/qwen2_test_runner.h"
#include "model/qwen2_weights.h"
#include "model/safetensors.h"

namespace mmserve::model {
namespace {

constexpr char kModel[] = "qwen2vl-tiny-mqa-bf16";

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

struct LoadedModel {
  ModelConfig cfg;
  std::unique_ptr<SafetensorsCheckpoint> ckpt;
  std::unique_ptr<Qwen2Weights> weights;
};

LoadedModel Load() {
  const std::string dir = std::string("model/testdata/models/") + kModel;
  LoadedModel m;
  auto cfg = LoadModelConfig(dir);
  REQUIRE(cfg.ok());
  m.cfg = *cfg;
  auto ckpt = SafetensorsCheckpoint::Open(dir);
  REQUIRE(ckpt.ok());
  m.ckpt = std::move(ckpt).value();
  auto w = Qwen2Weights::Load(*m.ckpt, m.cfg.text, {});
  INFO(w.status().ToString());
  REQUIRE(w.ok());
  m.weights = std::move(w).value();
  REQUIRE(m.weights->layers()[0].gate.dtype == DType::kBF16);
  return m;
}

float MaxAbsDiff(const std::vector<float>& a, const TensorView* b) {
  REQUIRE(b != nullptr);
  REQUIRE(static_cast<int64_t>(a.size()) == b->numel());
  const float* bf = reinterpret_cast<const float*>(b->data);
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - bf[i]));
  return worst;
}

TEST_CASE("bf16-activation logits and greedy tokens match transformers in bfloat16",
          "[parity][bf16]") {
  LoadedModel m = Load();
  const std::string base = std::string("model/testdata/bf16_goldens/") + kModel + "/bf16";
  const nlohmann::json g = ReadJson(base + ".json");
  auto tensors = SafetensorsFile::Open(base + ".safetensors");
  REQUIRE(tensors.ok());
  const std::vector<int> masked = g["eos_ids_masked"].get<std::vector<int>>();
  cpu::ThreadPool pool(2);
  Qwen2Model model(m.cfg.text, *m.weights, pool, {cpu::LinearKernel::kBf16Dot});
  for (const auto& p : g["prompts"]) {
    const std::string prompt = p["name"];
    INFO(prompt);
    TestRunner runner(model, /*num_blocks=*/128, /*block_size=*/4);
    const int s = runner.AddSequence(p["input_ids"].get<std::vector<int32_t>>());
    auto step = runner.Step({{s, runner.Uncached(s)}});
    REQUIRE(step.ok());
    std::vector<float> last = (*step)[0].back();
    const float shift = p["bf16_logit_shift"].get<float>();
    const float vs_fp32 = MaxAbsDiff(last, (*tensors)->Find("logits_fp32." + prompt));
    const float vs_bf16 = MaxAbsDiff(last, (*tensors)->Find("logits_last." + prompt));
    const auto want_ids = p["greedy_ids"].get<std::vector<int32_t>>();
    const auto margin = p["greedy_top2_margin"].get<std::vector<float>>();
    size_t robust = 0;  // steps before the bfloat16 model's first near-tie
    while (robust < margin.size() && margin[robust] > 2 * shift) ++robust;
    std::vector<int32_t> got;
    for (size_t i = 0; i < want_ids.size(); ++i) {
      got.push_back(GreedyToken(last, masked));
      runner.Append(s, got.back());
      if (i + 1 == want_ids.size()) break;
      auto next = runner.Step({{s, 1}});
      REQUIRE(next.ok());
      last = (*next)[0][0];
    }
    size_t same = 0;
    while (same < got.size() && got[same] == want_ids[same]) ++same;
    std::printf(
        "parity bf16 %-6s max|dlogit| vs fp32 %.3g (bound %.3g), vs bfloat16 %.3g (bound %.3g), "
        "greedy %zu/%zu identical (%zu before the first margin <= the bound)\n",
        prompt.c_str(), vs_fp32, shift, vs_bf16, 2 * shift, same, got.size(), robust);
    CHECK(vs_fp32 <= shift);
    CHECK(vs_bf16 <= 2 * shift);
    CHECK(same >= robust);
  }
}

TEST_CASE("a bf16-activation sequence's logits do not depend on its batch", "[parity][bf16]") {
  LoadedModel m = Load();
  cpu::ThreadPool pool(2);
  Qwen2Model model(m.cfg.text, *m.weights, pool, {cpu::LinearKernel::kBf16Dot});
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
  // A decode step next to another sequence's decode step.
  alone.Append(sa, 77);
  together.Append(ta, 77);
  together.Append(tb, 78);
  auto one2 = alone.Step({{sa, 1}});
  auto both2 = together.Step({{ta, 1}, {tb, 1}});
  REQUIRE(one2.ok());
  REQUIRE(both2.ok());
  CHECK(std::memcmp((*one2)[0][0].data(), (*both2)[0][0].data(), x.size() * sizeof(float)) == 0);
}

}  // namespace
}  // namespace mmserve::model
