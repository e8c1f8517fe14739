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
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/cpu/linear.h"
#include "model/cpu/thread_pool.h"
#include "model/model_config.h"
#include "model/qwen2_golden_testing.h"
#include "model/qwen2_model.h"
#include "model/qwen2_test_runner.h"
#include "model/qwen2_weights.h"
#include "model/safetensors.h"

namespace mmserve::model {
namespace {

constexpr char kModel[] = "qwen2vl-tiny-mqa-bf16";

LoadedModel Load() {
  LoadedModel m = LoadTestModel(kModel, {});
  REQUIRE(m.weights->layers()[0].gate.dtype == DType::kBF16);
  return m;
}

// max |a - b| where b is a golden tensor of a's size.
float GoldenDiff(const std::vector<float>& a, const TensorView* b) {
  REQUIRE(b != nullptr);
  REQUIRE(static_cast<int64_t>(a.size()) == b->numel());
  return MaxAbsDiff(a, reinterpret_cast<const float*>(b->data));
}

TEST_CASE("bf16-activation logits and greedy tokens match transformers in bfloat16",
          "[parity][bf16]") {
  LoadedModel m = Load();
  const std::string base = std::string("model/testdata/bf16_goldens/") + kModel + "/bf16";
  const nlohmann::json g = ReadJsonFile(base + ".json");
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
    const float vs_fp32 = GoldenDiff(last, (*tensors)->Find("logits_fp32." + prompt));
    const float vs_bf16 = GoldenDiff(last, (*tensors)->Find("logits_last." + prompt));
    const auto want_ids = p["greedy_ids"].get<std::vector<int32_t>>();
    const auto margin = p["greedy_top2_margin"].get<std::vector<float>>();
    // Steps before the bfloat16 model's first near-tie.
    const size_t robust = StepsBeforeNearTie(margin, 2 * shift);
    const std::vector<int32_t> got = GreedyTokens(runner, s, last, want_ids.size(), masked);
    const size_t same = CommonPrefix(got, want_ids);
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
  CheckBatchInvariance(model);
}

}  // namespace
}  // namespace mmserve::model
