#include "model/qwen2_test_runner.h"

#include <algorithm>
#include <random>

#include "common/logging.h"
#include "common/status_macros.h"

namespace mmserve::model {

TestRunner::TestRunner(Qwen2Model& model, int64_t num_blocks, int64_t block_size)
    : model_(model), block_size_(block_size) {
  auto kv = KvCache::Create(model.KvShape(num_blocks, block_size));
  CHECK_OK(kv.status());
  kv_ = std::move(kv).value();
  for (int32_t b = 0; b < num_blocks; ++b) free_blocks_.push_back(b);
  std::mt19937 gen(42);
  std::shuffle(free_blocks_.begin(), free_blocks_.end(), gen);
}

int TestRunner::AddSequence(std::vector<int32_t> prompt) {
  seqs_.push_back({std::move(prompt), 0, {}});
  return static_cast<int>(seqs_.size()) - 1;
}

absl::StatusOr<std::vector<std::vector<std::vector<float>>>> TestRunner::Step(
    const std::vector<std::pair<int, int64_t>>& work, bool all_rows) {
  ForwardBatch batch;
  std::vector<int64_t> pos;
  std::vector<std::pair<size_t, size_t>> rows_of_item;  // [begin, end) in logits_rows
  for (const auto& [id, n] : work) {
    Seq& s = seqs_[id];
    CHECK_LE(n, static_cast<int64_t>(s.tokens.size()) - s.cached);
    const int64_t context = s.cached + n;
    while (static_cast<int64_t>(s.blocks.size()) * block_size_ < context) {
      CHECK(!free_blocks_.empty()) << "test KV cache is full";
      s.blocks.push_back(free_blocks_.back());
      free_blocks_.pop_back();
    }
    SequenceChunk chunk{batch.num_tokens(), n, context, s.blocks};
    const size_t first_logit = batch.logits_rows.size();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = s.cached + i;
      batch.token_ids.push_back(s.tokens[p]);
      pos.push_back(p);
      batch.slot_mapping.push_back(s.blocks[p / block_size_] * block_size_ + p % block_size_);
      if (all_rows || i == n - 1) batch.logits_rows.push_back(chunk.query_start + i);
    }
    rows_of_item.push_back({first_logit, batch.logits_rows.size()});
    batch.sequences.push_back(std::move(chunk));
  }
  for (int c = 0; c < 3; ++c) batch.positions.insert(batch.positions.end(), pos.begin(), pos.end());
  std::vector<float> logits;
  RETURN_IF_ERROR(model_.Forward(batch, *kv_, &logits));
  for (const auto& [id, n] : work) seqs_[id].cached += n;
  const int64_t vocab = model_.config().vocab_size;
  std::vector<std::vector<std::vector<float>>> out;
  if (logits.empty()) {  // a tensor-parallel rank other than 0
    out.resize(rows_of_item.size());
    return out;
  }
  for (const auto& [begin, end] : rows_of_item) {
    out.emplace_back();
    for (size_t r = begin; r < end; ++r) {
      out.back().emplace_back(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
    }
  }
  return out;
}

int32_t GreedyToken(const std::vector<float>& logits, const std::vector<int>& masked) {
  int32_t best = -1;
  for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i) {
    if (std::find(masked.begin(), masked.end(), i) != masked.end()) continue;
    if (best < 0 || logits[i] > logits[best]) best = i;
  }
  return best;
}

}  // namespace mmserve::model
