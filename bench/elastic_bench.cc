// Elastic sequence parallelism at Qwen2-0.5B dimensions (a spot
// check), random bf16 weights, every member one compute thread:
// - TTFT of one long prompt prefilled at degree 2 (two members, rows striped,
//   K/V all-gathered per layer over UCX shm, each keeping half) against
//   degree 1 (one instance's Forward);
// - a decode step with the KV spread over 2 (the master holds the second
//   half, the holder answers span queries over UCX shm) against one
//   instance's decode step at the same context.
// The configurations alternate per round; the figures are medians over the
// rounds, reported as ratios (this machine is shared and noisy).
//
//   bazel run -c opt //bench:elastic_bench -- --prompt=1024 --layers=4
//
// Prints a human table, then one JSON line last.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/elastic_group.h"
#include "bench/qwen2_dims.h"
#include "common/clock.h"
#include "common/logging.h"
#include "model/cpu/split_attention.h"
#include "model/cpu/thread_pool.h"
#include "model/kv_cache.h"
#include "model/qwen2_model.h"
#include "model/qwen2_weights.h"
#include "transfer/elastic_span_attention.h"

ABSL_FLAG(int64_t, prompt, 1024, "prompt tokens");
ABSL_FLAG(int, layers, 4, "decoder layers (Qwen2-0.5B has 24; the ratios are per layer)");
ABSL_FLAG(int, rounds, 3, "alternating rounds");
ABSL_FLAG(int, decode_steps, 16, "decode steps per timed run");
ABSL_FLAG(int64_t, vocab, 0,
          "vocabulary size (0: Qwen2's 151936; a small one keeps the decode step's LM head "
          "from outweighing a few layers)");

namespace mmserve {
namespace {

using model::ForwardBatch;
using model::TextConfig;
namespace cpu = model::cpu;
namespace transfer = mmserve::transfer;

using Node = bench::ElasticBenchNode;

TextConfig Dims(int layers, int64_t vocab) {
  TextConfig cfg = Qwen2HalfBDims();
  cfg.num_hidden_layers = layers;
  if (vocab > 0) cfg.vocab_size = vocab;
  return cfg;
}

// A decode row at global position `pos` whose local keys are [0, local).
ForwardBatch Decode(const Node& node, int64_t pos, int64_t local, int64_t vocab) {
  ForwardBatch b;
  b.token_ids = {bench::ElasticBenchToken(pos, vocab)};
  b.positions = {pos, pos, pos};
  b.slot_mapping = {local - 1};
  b.sequences = {{0, 1, local, node.table}};
  b.logits_rows = {0};
  return b;
}

double Seconds(int64_t start) { return static_cast<double>(MonotonicNanos() - start) * 1e-9; }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Figures {
  std::vector<double> prefill1, prefill2, step1, step2, serial, parallel;
};

// The machine's parallelism now: two independent one-thread prefills of
// half the prompt one after the other, then at the same time. Their ratio
// is the most a degree-2 prefill can gain here (2 on two idle cores).
void Ceiling(const TextConfig& cfg, const model::Qwen2Weights& w, int64_t len, Figures& f) {
  Node a(cfg, w, len / 2), b(cfg, w, len / 2);
  auto run = [&](Node& n) { bench::TimedSinglePrefill(n, cfg, len / 2); };
  int64_t start = MonotonicNanos();
  run(a);
  run(b);
  f.serial.push_back(Seconds(start));
  start = MonotonicNanos();
  std::thread t([&] { run(a); });
  run(b);
  t.join();
  f.parallel.push_back(Seconds(start));
}

// One round: both prefills, then both decodes (steps seconds each).
void Round(transfer::UcxContext& ctx, const TextConfig& cfg, const model::Qwen2Weights& w,
           int64_t len, int steps, Figures& f) {
  // Rows striped over the two members; member 0 keeps [0, half).
  const std::vector<bench::ElasticShare> shares =
      bench::ElasticSplit(len, 2, bench::ElasticRows::kStriped);
  const int64_t half = shares[1].keep_begin;
  Node single(cfg, w, len + steps);
  f.prefill1.push_back(bench::TimedSinglePrefill(single, cfg, len));
  std::vector<std::unique_ptr<Node>> nodes;
  nodes.push_back(std::make_unique<Node>(cfg, w, half));
  nodes.push_back(std::make_unique<Node>(cfg, w, len - half + steps));
  f.prefill2.push_back(bench::TimedGroupPrefill(ctx, cfg, nodes, shares));

  int64_t start = MonotonicNanos();
  for (int s = 0; s < steps; ++s) {
    CHECK_OK(single.model.Forward(Decode(single, len + s, len + s + 1, cfg.vocab_size), *single.kv,
                                  &single.logits));
  }
  f.step1.push_back(Seconds(start) / steps);
  const int64_t q_width = cfg.num_attention_heads * cfg.head_dim();
  const transfer::ElasticSpanShape shape{2, 1, q_width, cfg.num_attention_heads};
  Node& holder = *nodes[0];
  const float scale = static_cast<float>(std::pow(static_cast<double>(cfg.head_dim()), -0.5));
  auto server = transfer::ElasticSpanServer::Create(
      ctx, shape, 0,
      [&](int layer, absl::Span<const uint64_t>, const float* q, int64_t rows, float* out,
          float* lse) {
        const model::KvCacheShape& ks = holder.kv->shape();
        const cpu::PagedKvLayer kv{holder.kv->Key(layer), holder.kv->Value(layer), ks.block_size,
                                   ks.num_kv_heads, ks.head_dim};
        std::vector<cpu::PartialSpan> spans;
        for (int64_t r = 0; r < rows; ++r) spans.push_back({r, holder.table.data(), half});
        cpu::PartialAttention(holder.pool, q, cfg.num_attention_heads, kv, spans, scale, out, lse);
        return absl::OkStatus();
      },
      {});
  CHECK_OK(server.status());
  auto peers = transfer::UcxSpanPeers::Create(ctx, shape, 1, {}, absl::Seconds(60));
  CHECK_OK(peers.status());
  CHECK_OK((*server)->Connect({{}, (*peers)->target()}));
  CHECK_OK((*peers)->Connect({(*server)->target(), {}}));
  (*peers)->SetBatch({0, 1}, 1, {0});
  Node& master = *nodes[1];
  start = MonotonicNanos();
  for (int s = 0; s < steps; ++s) {
    CHECK_OK(master.model.ForwardElasticDecode(
        Decode(master, len + s, len - half + s + 1, cfg.vocab_size), *master.kv, **peers,
        &master.logits));
  }
  f.step2.push_back(Seconds(start) / steps);
}

int Main() {
  const int64_t len = absl::GetFlag(FLAGS_prompt);
  const TextConfig cfg = Dims(absl::GetFlag(FLAGS_layers), absl::GetFlag(FLAGS_vocab));
  const auto weights = model::Qwen2Weights::Random(cfg, model::DType::kBF16, /*seed=*/1);
  auto ctx = transfer::UcxContext::Create(transfer::TransportProfile::kShm);
  CHECK_OK(ctx.status());
  Figures f;
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    Round(**ctx, cfg, *weights, len, absl::GetFlag(FLAGS_decode_steps), f);
    Ceiling(cfg, *weights, len, f);
  }
  const double ceiling = Median(f.serial) / Median(f.parallel);
  const double p1 = Median(f.prefill1), p2 = Median(f.prefill2);
  const double s1 = Median(f.step1), s2 = Median(f.step2);
  std::printf("Qwen2-0.5B dims, %d layers, prompt %lld, 1 thread a member, UCX shm\n",
              cfg.num_hidden_layers, static_cast<long long>(len));
  std::printf("  prefill  degree 1 %8.3f s   degree 2 %8.3f s   speed-up %.2fx\n", p1, p2, p1 / p2);
  std::printf("  ceiling  two half prompts serial / concurrent %.2fx (2 on two idle cores)\n",
              ceiling);
  std::printf("  decode   one instance %7.2f ms   spread over 2 %7.2f ms   ratio %.2f\n", s1 * 1e3,
              s2 * 1e3, s2 / s1);
  std::printf(
      "{\"prompt\": %lld, \"layers\": %d, \"prefill_dop1_s\": %.4f, \"prefill_dop2_s\": %.4f, "
      "\"ttft_dop2_vs_dop1\": %.3f, \"decode_step_single_ms\": %.3f, "
      "\"decode_step_spread_ms\": %.3f, \"decode_step_spread_ratio\": %.3f, "
      "\"parallel_ceiling\": %.3f}\n",
      static_cast<long long>(len), cfg.num_hidden_layers, p1, p2, p1 / p2, s1 * 1e3, s2 * 1e3,
      s2 / s1, ceiling);
  return 0;
}

}  // namespace
}  // namespace mmserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::Main();
}
