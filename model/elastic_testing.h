// Test-only helpers of the elastic sequence parallelism tests (model/elastic.h):
// prompts with text or image rows, a single-instance reference run, members
// of a prefill group as threads, and the plans the tests split prompts by.
// Uses Catch2's REQUIRE, so call it from test cases only.
//
//   Instance inst(model, 128, /*seed=*/1);
//   SingleRun single = RunSingle(model, inst, TextPrompt(ids), masked, 1);
//   InProcessKvGroup group(...);  // or UcxElasticExchange members
//   auto members = RunGroup(loaded, prompt, Plans(prompt.len())[0], {&group.member(0), ...});
#ifndef MMSERVE_MODEL_ELASTIC_TESTING_H_
#define MMSERVE_MODEL_ELASTIC_TESTING_H_

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "model/cpu/split_attention.h"
#include "model/cpu/thread_pool.h"
#include "model/elastic.h"
#include "model/qwen2_golden_testing.h"
#include "model/qwen2_model.h"
#include "model/qwen2_test_runner.h"

namespace mmserve::model {

inline constexpr int64_t kElasticBlockSize = 4;

// A prompt: ids, [3][L] positions, optional embedding rows.
struct Prompt {
  std::vector<int32_t> ids;
  std::vector<int64_t> pos;
  std::vector<std::pair<int64_t, std::vector<float>>> overrides;
  int64_t len() const { return static_cast<int64_t>(ids.size()); }
};

inline Prompt TextPrompt(std::vector<int32_t> ids) {
  Prompt p{std::move(ids), {}, {}};
  for (int c = 0; c < 3; ++c) {
    for (int64_t i = 0; i < p.len(); ++i) p.pos.push_back(i);
  }
  return p;
}

// Rows [5, 29) replaced by a 4 x 6 "image" of random embeddings with
// M-RoPE positions (t shared, h and w over the grid); text after resumes
// at 11 (HF's rule: max position + 1).
inline Prompt ImagePrompt(std::vector<int32_t> ids, int64_t hidden) {
  Prompt p{std::move(ids), {}, {}};
  const int64_t n = p.len();
  REQUIRE(n > 29);
  p.pos.assign(3 * n, 0);
  std::mt19937 gen(3);
  std::normal_distribution<float> d(0.0f, 0.05f);
  for (int64_t i = 0; i < n; ++i) {
    int64_t t = i, h = i, w = i;
    if (i >= 5 && i < 29) {
      t = 5;
      h = 5 + (i - 5) / 6;
      w = 5 + (i - 5) % 6;
      std::vector<float> e(hidden);
      for (float& x : e) x = d(gen);
      p.overrides.push_back({i, std::move(e)});
    } else if (i >= 29) {
      t = h = w = 11 + (i - 29);
    }
    p.pos[i] = t;
    p.pos[n + i] = h;
    p.pos[2 * n + i] = w;
  }
  return p;
}

// A cache with a shuffled free list.
struct Instance {
  std::unique_ptr<KvCache> kv;
  std::vector<int32_t> free, blocks;  // blocks: the sequence's table
  Instance(const Qwen2Model& model, int64_t num_blocks, uint32_t seed) {
    auto c = KvCache::Create(model.KvShape(num_blocks, kElasticBlockSize));
    REQUIRE(c.ok());
    kv = std::move(c).value();
    free.resize(num_blocks);
    std::iota(free.begin(), free.end(), 0);
    std::shuffle(free.begin(), free.end(), std::mt19937(seed));
  }
  // Slot of local token j, allocating blocks as needed.
  int64_t Slot(int64_t j) {
    while (static_cast<int64_t>(blocks.size()) * kElasticBlockSize <= j) {
      REQUIRE(!free.empty());
      blocks.push_back(free.back());
      free.pop_back();
    }
    return blocks[j / kElasticBlockSize] * kElasticBlockSize + j % kElasticBlockSize;
  }
};

// One decode row of a sequence whose local keys are [0, local_len).
inline ForwardBatch DecodeBatch(Instance& inst, int32_t token, int64_t position,
                                int64_t local_len) {
  ForwardBatch b;
  b.token_ids = {token};
  b.positions = {position, position, position};
  b.slot_mapping = {inst.Slot(local_len - 1)};
  b.sequences = {{0, 1, local_len, inst.blocks}};
  b.logits_rows = {0};
  return b;
}

struct SingleRun {
  std::vector<float> logits;  // [L][vocab], then decode rows appended
  std::vector<int32_t> greedy;
  std::vector<std::vector<float>> decode_logits;
};

// One instance: the whole prompt in one step (every row's logits), then
// greedy decode.
inline SingleRun RunSingle(Qwen2Model& model, Instance& inst, const Prompt& p,
                           const std::vector<int>& masked, int steps) {
  ForwardBatch b;
  b.token_ids = p.ids;
  b.positions = p.pos;
  for (int64_t i = 0; i < p.len(); ++i) {
    b.slot_mapping.push_back(inst.Slot(i));
    b.logits_rows.push_back(i);
  }
  b.sequences = {{0, p.len(), p.len(), inst.blocks}};
  for (const auto& [row, e] : p.overrides) b.embedding_overrides.push_back({row, e.data()});
  SingleRun r;
  REQUIRE(model.Forward(b, *inst.kv, &r.logits).ok());
  const int64_t vocab = model.config().vocab_size;
  std::vector<float> last(r.logits.end() - vocab, r.logits.end());
  const int64_t next_pos = p.len();  // text prompts: the next text position
  for (int s = 0; s < steps; ++s) {
    r.greedy.push_back(GreedyToken(last, masked));
    if (s + 1 == steps) break;
    ForwardBatch d = DecodeBatch(inst, r.greedy.back(), next_pos + s, p.len() + s + 1);
    REQUIRE(model.Forward(d, *inst.kv, &last).ok());
    r.decode_logits.push_back(last);
  }
  return r;
}

// A member's share: the rows it computes and the range it keeps.
struct Share {
  std::vector<int64_t> rows;
  int64_t keep_begin = 0, keep_end = 0;
};

struct Member {
  cpu::ThreadPool pool{1};
  std::unique_ptr<Qwen2Model> model;
  std::unique_ptr<Instance> inst;
  std::vector<float> logits;
  absl::Status status;
};

inline ElasticPrefillBatch MemberBatch(const Prompt& p, const Share& s, Instance& inst) {
  ElasticPrefillBatch b;
  const int64_t n = static_cast<int64_t>(s.rows.size());
  b.global_rows = s.rows;
  b.prompt_len = p.len();
  b.rows.positions.resize(3 * n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = s.rows[i];
    b.rows.token_ids.push_back(p.ids[g]);
    for (int c = 0; c < 3; ++c) b.rows.positions[c * n + i] = p.pos[c * p.len() + g];
    b.rows.logits_rows.push_back(i);
    for (const auto& [row, e] : p.overrides) {
      if (row == g) b.rows.embedding_overrides.push_back({i, e.data()});
    }
  }
  b.keep_begin = s.keep_begin;
  for (int64_t g = s.keep_begin; g < s.keep_end; ++g)
    b.keep_slots.push_back(inst.Slot(g - s.keep_begin));
  return b;
}

// Runs the group's prefill, one thread per member, member i on exchanges[i].
inline std::vector<std::unique_ptr<Member>> RunGroup(const LoadedModel& m, const Prompt& p,
                                                     const std::vector<Share>& shares,
                                                     const std::vector<KvExchange*>& exchanges) {
  const TextConfig& cfg = m.cfg.text;
  std::vector<std::unique_ptr<Member>> members;
  std::vector<ElasticPrefillBatch> batches;
  for (size_t i = 0; i < shares.size(); ++i) {
    auto mem = std::make_unique<Member>();
    mem->model = std::make_unique<Qwen2Model>(cfg, *m.weights, mem->pool);
    mem->inst = std::make_unique<Instance>(*mem->model, 128, 100 + i);
    batches.push_back(MemberBatch(p, shares[i], *mem->inst));
    members.push_back(std::move(mem));
  }
  std::vector<std::thread> threads;
  for (size_t i = 0; i < shares.size(); ++i) {
    threads.emplace_back([&, i] {
      Member& mem = *members[i];
      mem.status =
          mem.model->ForwardElasticPrefill(batches[i], *mem.inst->kv, *exchanges[i], &mem.logits);
    });
  }
  for (std::thread& t : threads) t.join();
  return members;
}

inline std::vector<int64_t> Range(int64_t begin, int64_t end) {
  std::vector<int64_t> r(end - begin);
  std::iota(r.begin(), r.end(), begin);
  return r;
}

// Plans over 2 and 3 members: contiguous shares keeping what they compute,
// and stripes whose kept ranges differ from their rows (one keeps nothing).
inline std::vector<std::vector<Share>> Plans(int64_t n) {
  const int64_t a =
      (n / 2 + kElasticBlockSize - 1) / kElasticBlockSize * kElasticBlockSize;  // block-aligned
  const int64_t b = std::min<int64_t>(n, 2 * kElasticBlockSize);
  std::vector<int64_t> stripe[3];
  for (int64_t i = 0; i < n; ++i) stripe[i % 3].push_back(i);
  return {
      {{Range(0, a), 0, a}, {Range(a, n), a, n}},
      {{Range(0, b), 0, b}, {Range(b, a), b, a}, {Range(a, n), a, n}},
      {{stripe[0], 0, a}, {stripe[1], a, n}, {stripe[2], 0, 0}},
  };
}

// Member `holder`'s partial attention for every row over its keys [0, keys).
inline absl::Status HolderPartials(Member& holder, int64_t keys, const TextConfig& cfg, int layer,
                                   const float* q, int64_t rows, float* out, float* lse) {
  const KvCacheShape& ks = holder.inst->kv->shape();
  const cpu::PagedKvLayer kv{holder.inst->kv->Key(layer), holder.inst->kv->Value(layer),
                             ks.block_size, ks.num_kv_heads, ks.head_dim};
  std::vector<cpu::PartialSpan> spans;
  for (int64_t r = 0; r < rows; ++r) spans.push_back({r, holder.inst->blocks.data(), keys});
  const float scale = static_cast<float>(std::pow(static_cast<double>(cfg.head_dim()), -0.5));
  cpu::PartialAttention(holder.pool, q, cfg.num_attention_heads, kv, spans, scale, out, lse);
  return absl::OkStatus();
}

// Two members in process: member 0 holds keys [0, keys) of every row's
// sequence, member 1 is the master.
class LocalPeers : public SpanAttentionPeers {
 public:
  LocalPeers(Member& holder, int64_t keys, const TextConfig& cfg)
      : holder_(holder), keys_(keys), cfg_(cfg) {}
  int num_members() const override { return 2; }
  int self() const override { return 1; }
  absl::Status Query(int member, int layer, const float* q, int64_t rows, float* out,
                     float* lse) override {
    REQUIRE(member == 0);
    return HolderPartials(holder_, keys_, cfg_, layer, q, rows, out, lse);
  }

 private:
  Member& holder_;
  int64_t keys_;
  const TextConfig& cfg_;
};

struct SpreadDecode {
  std::vector<int32_t> greedy;
  std::vector<std::vector<float>> logits;  // after each decode step
};

// Greedy decode of a text prompt on `master`, which keeps tokens [a, L) and
// appends the decoded ones; the peers hold the rest.
inline SpreadDecode DecodeSpread(Member& master, SpanAttentionPeers& peers, const Prompt& p,
                                 int64_t a, const std::vector<int>& masked, int steps,
                                 int64_t vocab) {
  SpreadDecode d;
  std::vector<float> last(master.logits.end() - vocab, master.logits.end());
  for (int s = 0; s < steps; ++s) {
    d.greedy.push_back(GreedyToken(last, masked));
    if (s + 1 == steps) break;
    ForwardBatch b = DecodeBatch(*master.inst, d.greedy.back(), p.len() + s, p.len() - a + s + 1);
    REQUIRE(master.model->ForwardElasticDecode(b, *master.inst->kv, peers, &last).ok());
    d.logits.push_back(last);
  }
  return d;
}

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_ELASTIC_TESTING_H_
