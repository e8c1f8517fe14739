// Test-only driver for Qwen2Model: a trivial KV block allocator and the
// ForwardBatch builder that a real engine (kvpool + scheduler) replaces.
//
//   TestRunner runner(model, /*num_blocks=*/64, /*block_size=*/4);
//   int a = runner.AddSequence(prompt_a), b = runner.AddSequence(prompt_b);
//   // one step: 5 prompt tokens of a, and b's remaining prompt
//   auto logits = runner.Step({{a, 5}, {b, runner.Uncached(b)}});
//   runner.Append(b, GreedyToken(logits->at(1).back(), vocab, {}));
//
// Blocks are handed out from a shuffled free list so block tables are not
// contiguous. Positions are text positions (all three M-RoPE rows equal).
// Not thread-safe.
#ifndef MMSERVE_MODEL_QWEN2_TEST_RUNNER_H_
#define MMSERVE_MODEL_QWEN2_TEST_RUNNER_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/kv_cache.h"
#include "model/qwen2_model.h"

namespace mmserve::model {

class TestRunner {
 public:
  TestRunner(Qwen2Model& model, int64_t num_blocks, int64_t block_size);

  int AddSequence(std::vector<int32_t> prompt);
  void Append(int seq, int32_t token) { seqs_[seq].tokens.push_back(token); }
  const std::vector<int32_t>& Tokens(int seq) const { return seqs_[seq].tokens; }
  // Tokens whose K/V is not in the cache yet.
  int64_t Uncached(int seq) const {
    return static_cast<int64_t>(seqs_[seq].tokens.size()) - seqs_[seq].cached;
  }

  // Feeds the next n uncached tokens of each listed sequence as one batch.
  // Result[i] holds the logits rows of work[i]: every fed row when all_rows,
  // else only the last one; each row is vocab_size floats. On a
  // tensor-parallel rank other than 0 every Result[i] is empty.
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> Step(
      const std::vector<std::pair<int, int64_t>>& work, bool all_rows = false);

 private:
  struct Seq {
    std::vector<int32_t> tokens;
    int64_t cached = 0;
    std::vector<int32_t> blocks;
  };

  Qwen2Model& model_;
  int64_t block_size_;
  std::unique_ptr<KvCache> kv_;
  std::vector<int32_t> free_blocks_;
  std::vector<Seq> seqs_;
};

// Argmax over n logits, skipping the `masked` ids (HF's generate with eos
// suppressed); ties go to the lowest id, as torch.argmax does.
int32_t GreedyToken(const std::vector<float>& logits, const std::vector<int>& masked);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_QWEN2_TEST_RUNNER_H_
