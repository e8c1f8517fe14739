#include "bench/elastic_group.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "common/clock.h"
#include "common/logging.h"
#include "transfer/elastic_kv_exchange.h"

namespace mmserve::bench {
namespace {

double SecondsSince(int64_t start) { return static_cast<double>(MonotonicNanos() - start) * 1e-9; }

// Member batch of `share`: its rows (positions = global indices) and its
// kept range into its cache's slots 0, 1, ...; the sampler's last row
// gives logits.
model::ElasticPrefillBatch MemberBatch(const ElasticShare& share, int64_t len, int64_t vocab,
                                       bool sampler) {
  model::ElasticPrefillBatch b;
  b.prompt_len = len;
  b.global_rows = share.rows;
  for (int64_t g : share.rows) b.rows.token_ids.push_back(ElasticBenchToken(g, vocab));
  for (int c = 0; c < 3; ++c) {
    b.rows.positions.insert(b.rows.positions.end(), share.rows.begin(), share.rows.end());
  }
  if (sampler) b.rows.logits_rows = {static_cast<int64_t>(share.rows.size()) - 1};
  b.keep_begin = share.keep_begin;
  for (int64_t g = share.keep_begin; g < share.keep_end; ++g) {
    b.keep_slots.push_back(g - share.keep_begin);
  }
  return b;
}

}  // namespace

ElasticBenchNode::ElasticBenchNode(const model::TextConfig& cfg, const model::Qwen2Weights& w,
                                   int64_t tokens)
    : model(cfg, w, pool) {
  const int64_t blocks = (tokens + kElasticBenchBlockSize - 1) / kElasticBenchBlockSize + 4;
  auto c = model::KvCache::Create(model.KvShape(blocks, kElasticBenchBlockSize));
  CHECK_OK(c.status());
  kv = std::move(c).value();
  for (int32_t b = 0; b < blocks; ++b) table.push_back(b);
}

int32_t ElasticBenchToken(int64_t i, int64_t vocab) {
  return static_cast<int32_t>((i * 7919) % vocab);
}

model::ForwardBatch ElasticSinglePrefillBatch(const ElasticBenchNode& node, int64_t len,
                                              int64_t vocab) {
  model::ForwardBatch b;
  for (int64_t i = 0; i < len; ++i) {
    b.token_ids.push_back(ElasticBenchToken(i, vocab));
    b.slot_mapping.push_back(i);
  }
  for (int c = 0; c < 3; ++c) {
    for (int64_t i = 0; i < len; ++i) b.positions.push_back(i);
  }
  b.sequences = {{0, len, len, node.table}};
  b.logits_rows = {len - 1};
  return b;
}

std::vector<ElasticShare> ElasticSplit(int64_t len, int members, ElasticRows how) {
  std::vector<ElasticShare> shares(members);
  const int64_t bs = kElasticBenchBlockSize;
  const int64_t chunk = (len / members + bs - 1) / bs * bs;
  for (int m = 0; m < members; ++m) {
    ElasticShare& s = shares[m];
    if (how == ElasticRows::kStriped) {
      for (int64_t g = m; g < len; g += members) s.rows.push_back(g);
    } else {
      for (int64_t g = len * m / members; g < len * (m + 1) / members; ++g) s.rows.push_back(g);
    }
    s.keep_begin = std::min(len, m * chunk);
    s.keep_end = m == members - 1 ? len : std::min(len, (m + 1) * chunk);
  }
  return shares;
}

double TimedSinglePrefill(ElasticBenchNode& node, const model::TextConfig& cfg, int64_t len) {
  const int64_t start = MonotonicNanos();
  CHECK_OK(node.model.Forward(ElasticSinglePrefillBatch(node, len, cfg.vocab_size), *node.kv,
                              &node.logits));
  return SecondsSince(start);
}

double TimedGroupPrefill(transfer::UcxContext& ctx, const model::TextConfig& cfg,
                         const std::vector<std::unique_ptr<ElasticBenchNode>>& nodes,
                         const std::vector<ElasticShare>& shares) {
  const int members = static_cast<int>(shares.size());
  CHECK(members <= static_cast<int>(nodes.size()));
  int64_t len = 0;
  for (const ElasticShare& s : shares) len += static_cast<int64_t>(s.rows.size());
  transfer::UcxElasticExchange::Plan plan{{}, len, cfg.num_key_value_heads * cfg.head_dim()};
  std::vector<model::ElasticPrefillBatch> batches;
  for (int m = 0; m < members; ++m) {
    batches.push_back(MemberBatch(shares[m], len, cfg.vocab_size, m == members - 1));
    plan.rows.push_back(shares[m].rows);
  }
  std::vector<std::unique_ptr<transfer::UcxElasticExchange>> ex;
  std::vector<transfer::ElasticExchangeTarget> targets;
  for (int m = 0; m < members; ++m) {
    auto e = transfer::UcxElasticExchange::Create(ctx, plan, m, {}, absl::Seconds(600));
    CHECK_OK(e.status());
    targets.push_back((*e)->target());
    ex.push_back(std::move(e).value());
  }
  for (auto& e : ex) CHECK_OK(e->Connect(targets));
  const int64_t start = MonotonicNanos();
  std::vector<std::thread> threads;
  for (int m = 0; m < members; ++m) {
    threads.emplace_back([&, m] {
      ElasticBenchNode& n = *nodes[m];
      CHECK_OK(n.model.ForwardElasticPrefill(batches[m], *n.kv, *ex[m], &n.logits));
    });
  }
  for (std::thread& t : threads) t.join();
  return SecondsSince(start);
}

}  // namespace mmserve::bench
