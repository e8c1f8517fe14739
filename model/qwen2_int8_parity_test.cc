// --quantize=int8 / int8_g32, with int16 activations and with int8 ones
// (LinearKernel::kInt8Act), against transformers on the same dequantized
// weights (model/testdata/int8_goldens, written by tools/int8_goldens.py with
// mmserve's scheme), and batch invariance of the int8 model.
//
// Tolerance: the goldens are computed on weights q * s with fp32
// activations. mmserve's int8 layers also round each activation row to
// int16 (linear.h): a step of max|x| / 32767 against the weights' max|w| /
// 127, 2^8 finer, on the same products. So the activation rounding moves the
// logits by about 2^-8 of what the weight rounding moves them
// (`quantization_logit_shift` in the goldens, 0.14-0.45 on these models):
// each prompt's bound is 4x that, shift / 64 (2.2e-3 to 7.1e-3; measured
// gaps 0.8e-3 to 1.9e-3), and never below the fp32 parity bound 1e-3.
// Greedy tokens must be identical up to the first step whose HF top-2 margin
// is at most the bound (past a near-tie either token is a correct answer and
// the sequences may diverge).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
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

constexpr float kFp32Tolerance = 1e-3f;

// With int8 activations (LinearKernel::kInt8Act) the activation step,
// max|x| / 127 over each block of 32 columns, is as coarse relative to the
// block's largest value as the weights' step is to theirs, so the rounding
// moves the logits by about as much again as the weights' own shift:
// measured 0.43-1.41x the shift on these models (greedy tokens then
// diverge within 1-23 steps, at near-ties of margin below the bound). The
// bound, 2x the shift, records that accuracy cost.
float Tolerance(const nlohmann::json& prompt, cpu::LinearKernel kernel) {
  const float shift = prompt["quantization_logit_shift"].get<float>();
  if (kernel == cpu::LinearKernel::kInt8Act) return 2 * shift;
  return std::max(kFp32Tolerance, shift / 64);
}

const char* const kModels[] = {"qwen2vl-tiny-mqa-bf16", "qwen2vl-tiny-gqa2-untied-sharded"};
const char* const kSchemes[] = {"int8", "int8_g32"};

LoadedModel Load(const std::string& name, const std::string& scheme) {
  auto options = ParseQuantize(scheme);
  REQUIRE(options.ok());
  LoadedModel m = LoadTestModel(name, *options);
  REQUIRE(m.weights->layers()[0].gate.dtype == DType::kI8);
  return m;
}

TEST_CASE("int8 logits and greedy tokens match transformers on the dequantized weights",
          "[parity][int8]") {
  for (const char* name : kModels) {
    for (const char* scheme : kSchemes) {
      LoadedModel m = Load(name, scheme);
      const std::string base = std::string("model/testdata/int8_goldens/") + name + "/" + scheme;
      const nlohmann::json g = ReadJsonFile(base + ".json");
      auto tensors = SafetensorsFile::Open(base + ".safetensors");
      REQUIRE(tensors.ok());
      const std::vector<int> masked = g["eos_ids_masked"].get<std::vector<int>>();
      cpu::ThreadPool pool(2);
      for (cpu::LinearKernel kernel : {cpu::LinearKernel::kDot, cpu::LinearKernel::kInt8Act}) {
        Qwen2Model model(m.cfg.text, *m.weights, pool, {kernel});
        const char* activations = kernel == cpu::LinearKernel::kInt8Act ? "int8" : "int16";
        for (const auto& p : g["prompts"]) {
          const std::string prompt = p["name"];
          INFO(name << " " << scheme << " " << prompt << " " << activations << " activations");
          TestRunner runner(model, /*num_blocks=*/128, /*block_size=*/4);
          const int s = runner.AddSequence(p["input_ids"].get<std::vector<int32_t>>());
          auto step = runner.Step({{s, runner.Uncached(s)}});
          REQUIRE(step.ok());
          const TensorView* want = (*tensors)->Find("logits_last." + prompt);
          REQUIRE(want != nullptr);
          std::vector<float> last = (*step)[0].back();
          REQUIRE(static_cast<int64_t>(last.size()) == want->numel());
          const float diff = MaxAbsDiff(last, reinterpret_cast<const float*>(want->data));
          const auto want_ids = p["greedy_ids"].get<std::vector<int32_t>>();
          const auto margin = p["greedy_top2_margin"].get<std::vector<float>>();
          const float tolerance = Tolerance(p, kernel);
          const size_t robust =
              StepsBeforeNearTie(margin, tolerance);  // before HF's first near-tie
          const std::vector<int32_t> got = GreedyTokens(runner, s, last, want_ids.size(), masked);
          const size_t same = CommonPrefix(got, want_ids);
          std::printf(
              "parity %-8s %-5s x %-34s %-6s max|dlogit| %.3g (bound %.2g), greedy %zu/%zu "
              "identical (%zu before HF's first margin <= the bound)\n",
              scheme, activations, name, prompt.c_str(), diff, tolerance, same, got.size(), robust);
          CHECK(diff <= tolerance);
          CHECK(same >= robust);
        }
      }
    }
  }
}

TEST_CASE("int8 experts: quantized per expert, the router kept, batch-invariant", "[int8]") {
  auto options = ParseQuantize("int8");
  REQUIRE(options.ok());
  LoadedModel m = LoadTestModel("qwen3moe-tiny-top2", *options);
  const Qwen2LayerWeights& l = m.weights->layers()[0];
  REQUIRE(l.experts.size() == 8);
  for (const auto& x : l.experts) {
    CHECK(x.gate.dtype == DType::kI8);
    CHECK(x.down.dtype == DType::kI8);
  }
  CHECK(l.router.dtype == DType::kF32);  // int8 router logits could route elsewhere
  cpu::ThreadPool pool(2);
  Qwen2Model model(m.cfg.text, *m.weights, pool);
  CheckBatchInvariance(model);
}

TEST_CASE("an int8 sequence's logits do not depend on its batch", "[parity][int8]") {
  for (const char* scheme : kSchemes) {
    LoadedModel m = Load("qwen2vl-tiny-mqa-bf16", scheme);
    cpu::ThreadPool pool(2);
    for (cpu::LinearKernel kernel : {cpu::LinearKernel::kDot, cpu::LinearKernel::kInt8Act}) {
      Qwen2Model model(m.cfg.text, *m.weights, pool, {kernel});
      INFO(scheme << " int8 activations " << (kernel == cpu::LinearKernel::kInt8Act));
      CheckBatchInvariance(model);
    }
  }
}

}  // namespace
}  // namespace mmserve::model
