// Test-only helpers of the Qwen2 parity tests against goldens: reading a
// golden's JSON, loading a committed tiny model, comparing logits, and the
// batch-invariance check every numeric mode must pass. Uses Catch2's
// REQUIRE/CHECK, so call it from test cases only. Not thread-safe.
//
//   LoadedModel m = LoadTestModel("qwen2vl-tiny-mqa-bf16", {});
//   Qwen2Model model(m.cfg.text, *m.weights, pool, {cpu::LinearKernel::kBf16Dot});
//   CheckBatchInvariance(model);
#ifndef MMSERVE_MODEL_QWEN2_GOLDEN_UTIL_H_
#define MMSERVE_MODEL_QWEN2_GOLDEN_UTIL_H_

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/model_config.h"
#include "model/qwen2_model.h"
#include "model/qwen2_test_runner.h"
#include "model/qwen2_weights.h"
#include "model/safetensors.h"

namespace mmserve::model {

// REQUIREs that the file opens and parses.
nlohmann::json ReadJsonFile(const std::string& path);

struct LoadedModel {
  ModelConfig cfg;
  std::unique_ptr<SafetensorsCheckpoint> ckpt;
  std::unique_ptr<Qwen2Weights> weights;
};

// The config and checkpoint in dir, no weights loaded; REQUIREs success.
LoadedModel OpenModelDir(const std::string& dir);
// The checkpoint in dir with these weight options; REQUIREs success.
LoadedModel LoadModelDir(const std::string& dir, const Qwen2WeightsOptions& options = {});
// model/testdata/models/<name>.
LoadedModel LoadTestModel(const std::string& name, const Qwen2WeightsOptions& options = {});

// The f32 tensor `name` of f, copied; REQUIREs that it is there and f32.
std::vector<float> F32Tensor(const SafetensorsFile& f, const std::string& name);

// One sequence's prefill and decode through Qwen2Model::Forward, its KV in a
// cache of its own sized for `capacity` rows; REQUIREs every step succeeds.
class GoldenSequence {
 public:
  GoldenSequence(Qwen2Model& model, int64_t capacity);

  // Feeds rows [len, len + ids.size()) at positions `pos` ([3][rows]);
  // returns the last row's logits.
  std::vector<float> Step(const std::vector<int32_t>& ids, const std::vector<int64_t>& pos,
                          std::vector<EmbeddingOverride> overrides = {});

 private:
  static constexpr int64_t kBlock = 16;
  Qwen2Model& model_;
  std::unique_ptr<KvCache> kv_;
  std::vector<int32_t> blocks_;
  int64_t len_ = 0;
};

// max_i |a[i] - b[i]| over a.size() entries.
float MaxAbsDiff(const std::vector<float>& a, const float* b);

// n greedy tokens (masked ids skipped) of a sequence whose last logits are
// `last`, each appended to the sequence and the next one decoded.
std::vector<int32_t> GreedyTokens(TestRunner& runner, int seq, std::vector<float> last, size_t n,
                                  const std::vector<int>& masked);

// Entries before the first i where a[i] != b[i].
size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

// Steps before the first whose top-2 margin is at most `bound` (past a
// near-tie either token is a correct answer).
size_t StepsBeforeNearTie(const std::vector<float>& margins, float bound);

// CHECKs that a sequence's logits are bitwise the same alone and beside
// another sequence, for a prefill chunk and then a decode step.
void CheckBatchInvariance(Qwen2Model& model);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_QWEN2_GOLDEN_UTIL_H_
