// Group prefills for the elastic-sequence-parallelism benchmarks
// (bench:elastic_bench, bench:elastic_profile): members that each run a
// Qwen2 model on one thread over their own KV cache, a prompt's rows split
// among them, the K/V all-gathered per layer over UCX (UcxElasticExchange, as
// `language --role=elastic` runs it), each member keeping a block-aligned
// range of the prompt's KV.
//
//   auto weights = model::Qwen2Weights::Random(cfg, model::DType::kBF16, 1);
//   std::vector<std::unique_ptr<ElasticBenchNode>> nodes;  // one per member
//   nodes.push_back(std::make_unique<ElasticBenchNode>(cfg, *weights, max_tokens));
//   double one = TimedSinglePrefill(*nodes[0], cfg, len);              // degree 1
//   double two = TimedGroupPrefill(*ctx, cfg, nodes,                   // degree 2
//                                  ElasticSplit(len, 2, ElasticRows::kContiguous));
//
// Token ids are a fixed pattern; positions are the rows' indices (text).
// Thread-safety: none; one caller at a time (a group runs a thread per
// member inside TimedGroupPrefill).
#ifndef MMSERVE_BENCH_ELASTIC_GROUP_H_
#define MMSERVE_BENCH_ELASTIC_GROUP_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "model/cpu/thread_pool.h"
#include "model/elastic.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/qwen2_model.h"
#include "model/qwen2_weights.h"
#include "transfer/ucx_context.h"

namespace mmserve::bench {

inline constexpr int64_t kElasticBenchBlockSize = 16;

// One instance (or member): a model on one thread and a cache whose blocks
// 0, 1, ... hold its tokens in order, room for `tokens` of them.
struct ElasticBenchNode {
  model::cpu::ThreadPool pool{1};
  model::Qwen2Model model;
  std::unique_ptr<model::KvCache> kv;
  std::vector<int32_t> table;
  std::vector<float> logits;
  ElasticBenchNode(const model::TextConfig& cfg, const model::Qwen2Weights& w, int64_t tokens);
};

int32_t ElasticBenchToken(int64_t i, int64_t vocab);

// The whole prompt as one instance's single prefill step.
model::ForwardBatch ElasticSinglePrefillBatch(const ElasticBenchNode& node, int64_t len,
                                              int64_t vocab);

// How a prompt's rows are split: contiguous near-equal runs (the router's
// plans, router/elastic_group_plan.h) or stripes (rows m, m + d, ...).
enum class ElasticRows { kContiguous, kStriped };

// One member's share: the global rows it computes and the range it keeps.
struct ElasticShare {
  std::vector<int64_t> rows;
  int64_t keep_begin = 0, keep_end = 0;
};
// `members` shares of a prompt of `len`: rows as `how` says; member m keeps
// [m c, (m + 1) c) clipped to the prompt, c = len / members rounded up to
// whole blocks, the last member the rest (it also samples).
std::vector<ElasticShare> ElasticSplit(int64_t len, int members, ElasticRows how);

// Seconds of one instance's prefill of `len` tokens.
double TimedSinglePrefill(ElasticBenchNode& node, const model::TextConfig& cfg, int64_t len);

// Seconds of a group prefill (from the first member's start to the last
// member's end; the exchanges are created and connected before): member m
// is nodes[m] with shares[m] (shares.size() <= nodes.size(); each node's
// cache holds its kept range). CHECK-fails on an error.
double TimedGroupPrefill(transfer::UcxContext& ctx, const model::TextConfig& cfg,
                         const std::vector<std::unique_ptr<ElasticBenchNode>>& nodes,
                         const std::vector<ElasticShare>& shares);

}  // namespace mmserve::bench

#endif  // MMSERVE_BENCH_ELASTIC_GROUP_H_
