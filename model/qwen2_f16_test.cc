// F16 checkpoints: model/testdata/f16 holds one tiny model's language
// weights rounded to fp16, stored once as F16 and once as the same values in
// F32 (tools/f16_checkpoint.py). fp16 -> fp32 is exact, so loading either
// must give bitwise the same logits: unquantized (F16 matrices are widened to
// fp32 at load) and with --quantize=int8 / int8_g32 (quantized from the F16
// rows directly). The F32 path itself is checked against transformers by
// qwen2_parity_test and qwen2_int8_parity_test.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "model/cpu/thread_pool.h"
#include "model/model_config.h"
#include "model/qwen2_golden_testing.h"
#include "model/qwen2_model.h"
#include "model/qwen2_test_runner.h"
#include "model/qwen2_weights.h"
#include "model/safetensors.h"

namespace mmserve::model {
namespace {

constexpr char kDir[] = "model/testdata/f16/qwen2vl-tiny-gqa2-untied-sharded/";

LoadedModel Load(const std::string& kind, const std::string& scheme) {
  auto options = ParseQuantize(scheme);
  REQUIRE(options.ok());
  return LoadModelDir(kDir + kind, *options);
}

// Logits of every position of a prefill, then of three decode steps.
std::vector<std::vector<float>> Run(const LoadedModel& m) {
  cpu::ThreadPool pool(2);
  Qwen2Model model(m.cfg.text, *m.weights, pool);
  TestRunner runner(model, /*num_blocks=*/32, /*block_size=*/4);
  const int s = runner.AddSequence({5, 17, 300, 42, 7, 99, 1000, 3, 64});
  std::vector<std::vector<float>> out;
  auto step = runner.Step({{s, runner.Uncached(s)}});
  REQUIRE(step.ok());
  for (const std::vector<float>& row : (*step)[0]) out.push_back(row);
  for (int32_t token : {11, 400, 2}) {
    runner.Append(s, token);
    auto next = runner.Step({{s, 1}});
    REQUIRE(next.ok());
    out.push_back((*next)[0][0]);
  }
  return out;
}

TEST_CASE("an F16 checkpoint gives the logits of its exact F32 twin", "[f16]") {
  for (const char* scheme : {"", "int8", "int8_g32"}) {
    INFO("quantize '" << scheme << "'");
    LoadedModel f16 = Load("f16", scheme);
    LoadedModel f32 = Load("f32", scheme);
    REQUIRE(f16.ckpt->Find("lm_head.weight")->dtype == DType::kF16);
    const DType want = *scheme == '\0' ? DType::kF32 : DType::kI8;
    CHECK(f16.weights->layers()[0].gate.dtype == want);
    CHECK(f16.weights->lm_head().dtype == want);
    // The untied embedding stays as stored and is looked up row by row.
    CHECK(f16.weights->embed().dtype == DType::kF16);
    const std::vector<std::vector<float>> a = Run(f16), b = Run(f32);
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      INFO("row " << i);
      CHECK(a[i] == b[i]);
    }
    // Not a vacuous comparison: the logits are finite and not all equal.
    CHECK(a.back().front() != a.back().back());
  }
}

}  // namespace
}  // namespace mmserve::model
