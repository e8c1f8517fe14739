// A TP=2 instance driven the way the engine will drive it: rank 0 sends each
// step through the step ring and runs its part; rank 1 (a forked process)
// runs RunShardSteps. Checked against one rank on the demo model, with image
// rows (embedding overrides) in the prompt and greedy tokens chosen by rank
// 0 only; and a rank killed mid-decode.
#include "worker/tp_step_loop.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "model/cpu/thread_pool.h"
#include "model/model_config.h"
#include "model/qwen2_weights.h"
#include "model/safetensors.h"
#include "worker/fork_ranks.h"
#include "worker/shm_communicator.h"
#include "worker/shm_segment.h"

namespace mmserve::worker {
namespace {

constexpr char kModelDir[] = "models/shapes-demo";
constexpr int64_t kBlockSize = 4;
constexpr int kDecodeSteps = 12;

// Outside Catch's assertions (forked ranks call it too).
void Must(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::abort();
  }
}

struct Loaded {
  model::ModelConfig cfg;
  std::unique_ptr<model::SafetensorsCheckpoint> ckpt;
  std::unique_ptr<model::Qwen2Weights> weights;
};

Loaded Load(model::TensorParallelShard shard) {
  Loaded l;
  auto cfg = model::LoadModelConfig(kModelDir);
  Must(cfg.status());
  l.cfg = *cfg;
  auto ckpt = model::SafetensorsCheckpoint::Open(kModelDir);
  Must(ckpt.status());
  l.ckpt = *std::move(ckpt);
  model::Qwen2WeightsOptions o;
  o.shard = shard;
  auto w = model::Qwen2Weights::Load(*l.ckpt, l.cfg.text, o);
  Must(w.status());
  l.weights = *std::move(w);
  return l;
}

// The prompt of two sequences: 9 and 6 tokens, rows 2..4 of the first an
// image (embedding overrides with made-up values).
struct Prompt {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<float> image;  // 3 rows x hidden
  // Where the image rows are read from: image, or a copy in the shared
  // receive buffer.
  const float* image_rows = nullptr;
};

Prompt MakePrompt(int64_t hidden, int64_t vocab) {
  Prompt p;
  p.tokens = {{5, 17, 0, 0, 0, 40, 41, 42, 7}, {3, 9, 27, 81, 11, 5}};
  for (auto& seq : p.tokens) {
    for (int32_t& t : seq) t = static_cast<int32_t>(t % vocab);
  }
  p.image.resize(3 * hidden);
  for (size_t i = 0; i < p.image.size(); ++i) p.image[i] = std::sin(0.37f * i) * 0.05f;
  return p;
}

// One step over sequences with `fresh[s]` new tokens each (prefill: all).
model::ForwardBatch MakeStep(const std::vector<std::vector<int32_t>>& tokens,
                             const std::vector<int64_t>& fresh, const Prompt& p, int64_t hidden) {
  model::ForwardBatch b;
  std::vector<int64_t> pos;
  for (size_t s = 0; s < tokens.size(); ++s) {
    const int64_t len = static_cast<int64_t>(tokens[s].size());
    const int64_t start = len - fresh[s];
    model::SequenceChunk chunk{b.num_tokens(), fresh[s], len, {}};
    // Sequence s owns blocks s * 16 ..
    for (int64_t blk = 0; blk * kBlockSize < len; ++blk) {
      chunk.block_table.push_back(static_cast<int32_t>(s * 16 + blk));
    }
    for (int64_t i = start; i < len; ++i) {
      if (s == 0 && i >= 2 && i < 5) {
        const float* rows = p.image_rows != nullptr ? p.image_rows : p.image.data();
        b.embedding_overrides.push_back({b.num_tokens(), rows + (i - 2) * hidden});
      }
      b.token_ids.push_back(tokens[s][i]);
      pos.push_back(i);
      b.slot_mapping.push_back((s * 16 + i / kBlockSize) * kBlockSize + i % kBlockSize);
    }
    b.logits_rows.push_back(b.num_tokens() - 1);
    b.sequences.push_back(std::move(chunk));
  }
  for (int c = 0; c < 3; ++c) b.positions.insert(b.positions.end(), pos.begin(), pos.end());
  return b;
}

int32_t Argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// Rank 0's (or the single rank's) generation: every step's logits and the
// greedy tokens. forward runs one batch and fills logits.
template <typename Forward>
absl::Status Generate(const Prompt& p, int64_t hidden, int64_t vocab, Forward forward,
                      std::vector<std::vector<float>>* all_logits, std::vector<int32_t>* greedy) {
  std::vector<std::vector<int32_t>> tokens = p.tokens;
  std::vector<int64_t> fresh;
  for (const auto& t : tokens) fresh.push_back(static_cast<int64_t>(t.size()));
  std::vector<float> logits;
  for (int step = 0; step <= kDecodeSteps; ++step) {
    const model::ForwardBatch b = MakeStep(tokens, fresh, p, hidden);
    absl::Status s = forward(b, &logits);
    if (!s.ok()) return s;
    all_logits->push_back(logits);
    for (size_t i = 0; i < tokens.size(); ++i) {
      const int32_t t = Argmax(logits.data() + i * vocab, vocab);
      greedy->push_back(t);
      tokens[i].push_back(t);
      fresh[i] = 1;
    }
  }
  return absl::OkStatus();
}

struct Instance {
  std::unique_ptr<ShmCommunicator> comm;
  std::unique_ptr<StepRing> ring;
};

Instance JoinInstance(const std::string& id, int rank, absl::Duration timeout) {
  ShmCommunicatorOptions co;
  co.instance_id = id;
  co.rank = rank;
  co.world_size = 2;
  co.timeout = timeout;
  StepRingOptions ro;
  ro.instance_id = id;
  ro.rank = rank;
  ro.world_size = 2;
  ro.timeout = timeout;
  Instance in;
  auto comm = ShmCommunicator::Join(co);
  auto ring = StepRing::Join(ro);
  if (comm.ok()) in.comm = *std::move(comm);
  if (ring.ok()) in.ring = *std::move(ring);
  return in;
}

// Rank 1's whole life: join, load its shard, run steps until stop or error.
// Exit code 0 on a kStop, 20 on UNAVAILABLE.
// The receive buffer every rank maps, here holding the image.
std::string BufferName(const std::string& id) { return "/mmserve-embbuf-" + id; }

absl::StatusOr<std::unique_ptr<ShmSegment>> JoinBuffer(const std::string& id, int rank,
                                                       size_t bytes) {
  ShmSegmentOptions o;
  o.name = BufferName(id);
  o.rank = rank;
  o.world_size = 2;
  o.user_bytes = bytes;
  return ShmSegment::Join(o);
}

// buffer_bytes > 0: also map the shared receive buffer.
int ShardRank(const std::string& id, size_t buffer_bytes = 0) {
  Instance in = JoinInstance(id, 1, absl::Seconds(30));
  if (in.comm == nullptr || in.ring == nullptr) return 10;
  std::unique_ptr<ShmSegment> buffer;
  absl::Span<const uint8_t> shared;
  if (buffer_bytes > 0) {
    auto b = JoinBuffer(id, 1, buffer_bytes);
    if (!b.ok()) return 13;
    buffer = *std::move(b);
    shared = absl::MakeConstSpan(static_cast<const uint8_t*>(buffer->data()), buffer_bytes);
  }
  Loaded l = Load({1, 2});
  model::cpu::ThreadPool pool(1);
  model::Qwen2Model m(l.cfg.text, *l.weights, pool,
                      {model::cpu::LinearKernel::kDot, in.comm.get()});
  absl::Status s = RunShardSteps(*in.ring, m, shared);
  if (s.ok()) return 0;
  std::fprintf(stderr, "shard rank: %s\n", s.ToString().c_str());
  return absl::IsUnavailable(s) ? 20 : 12;
}

TEST_CASE(
    "TP=2 through the step ring generates what one rank does, image rows inline or as "
    "descriptors into a shared receive buffer",
    "[tp_step_loop]") {
  // One rank first (its pool is gone before the fork).
  std::vector<std::vector<float>> want_logits;
  std::vector<int32_t> want_tokens;
  int64_t hidden = 0, vocab = 0;
  {
    Loaded l = Load({0, 1});
    hidden = l.cfg.text.hidden_size;
    vocab = l.cfg.text.vocab_size;
    model::cpu::ThreadPool pool(2);
    model::Qwen2Model m(l.cfg.text, *l.weights, pool);
    auto kv = model::KvCache::Create(m.KvShape(64, kBlockSize));
    REQUIRE(kv.ok());
    const Prompt p = MakePrompt(hidden, vocab);
    REQUIRE(Generate(
                p, hidden, vocab,
                [&](const model::ForwardBatch& b, std::vector<float>* logits) {
                  return m.Forward(b, **kv, logits);
                },
                &want_logits, &want_tokens)
                .ok());
  }
  for (EmbeddingPlacement placement :
       {EmbeddingPlacement::kInline, EmbeddingPlacement::kSharedBuffer}) {
    const bool shared = placement == EmbeddingPlacement::kSharedBuffer;
    INFO((shared ? "image rows as shared-buffer descriptors" : "image rows inline"));
    const std::string id = UniqueInstanceId("tp-loop");
    const size_t buffer_bytes = shared ? 3 * hidden * sizeof(float) : 0;
    const pid_t rank1 = ForkChild([&] { return ShardRank(id, buffer_bytes); });
    Instance in = JoinInstance(id, 0, absl::Seconds(30));
    REQUIRE(in.comm != nullptr);
    REQUIRE(in.ring != nullptr);
    Prompt p = MakePrompt(hidden, vocab);
    std::unique_ptr<ShmSegment> buffer;
    absl::Span<const uint8_t> shared_span;
    if (shared) {
      auto b = JoinBuffer(id, 0, buffer_bytes);
      REQUIRE(b.ok());
      buffer = *std::move(b);
      float* rows = static_cast<float*>(buffer->data());
      std::copy(p.image.begin(), p.image.end(), rows);
      p.image_rows = rows;
      shared_span = absl::MakeConstSpan(static_cast<const uint8_t*>(buffer->data()), buffer_bytes);
    }
    Loaded l = Load({0, 2});
    std::vector<std::vector<float>> got_logits;
    std::vector<int32_t> got_tokens;
    {
      model::cpu::ThreadPool pool(1);
      model::Qwen2Model m(l.cfg.text, *l.weights, pool,
                          {model::cpu::LinearKernel::kDot, in.comm.get()});
      auto kv = model::KvCache::Create(m.KvShape(64, kBlockSize));
      REQUIRE(kv.ok());
      REQUIRE(AllocateKvOnAllRanks(*in.ring, 64, kBlockSize).ok());
      absl::Status s = Generate(
          p, hidden, vocab,
          [&](const model::ForwardBatch& b, std::vector<float>* logits) {
            return ForwardOnAllRanks(*in.ring, m, **kv, b, placement, logits, shared_span);
          },
          &got_logits, &got_tokens);
      INFO(s.ToString());
      REQUIRE(s.ok());
      REQUIRE(StopShardSteps(*in.ring).ok());
    }
    CHECK(WaitChild(rank1) == 0);
    CHECK(got_tokens == want_tokens);
    REQUIRE(got_logits.size() == want_logits.size());
    float worst = 0;
    for (size_t i = 0; i < got_logits.size(); ++i) {
      REQUIRE(got_logits[i].size() == want_logits[i].size());
      for (size_t j = 0; j < got_logits[i].size(); ++j) {
        worst = std::max(worst, std::fabs(got_logits[i][j] - want_logits[i][j]));
      }
    }
    std::printf("tp step loop (%s): %zu steps, max|dlogit| %.3g, greedy %s\n",
                shared ? "shared buffer" : "inline", got_logits.size(), worst,
                got_tokens == want_tokens ? "identical" : "DIFFERENT");
    CHECK(worst <= 1e-4f);
    CHECK(access(("/dev/shm" + StepRingName(id)).c_str(), F_OK) != 0);
    CHECK(access(("/dev/shm" + ShmSegmentName(id)).c_str(), F_OK) != 0);
    CHECK(access(("/dev/shm" + BufferName(id)).c_str(), F_OK) != 0);
  }
}

TEST_CASE("a shard rank killed mid-decode fails rank 0's step with UNAVAILABLE, not a hang",
          "[tp_step_loop][fault]") {
  const std::string id = UniqueInstanceId("tp-loop-kill");
  const pid_t rank1 = ForkChild([&] { return ShardRank(id); });
  // Long timeouts: only the dead-peer checks can end rank 0's waits.
  Instance in = JoinInstance(id, 0, absl::Seconds(120));
  REQUIRE(in.comm != nullptr);
  REQUIRE(in.ring != nullptr);
  Loaded l = Load({0, 2});
  model::cpu::ThreadPool pool(1);
  model::Qwen2Model m(l.cfg.text, *l.weights, pool,
                      {model::cpu::LinearKernel::kDot, in.comm.get()});
  auto kv = model::KvCache::Create(m.KvShape(64, kBlockSize));
  REQUIRE(kv.ok());
  REQUIRE(AllocateKvOnAllRanks(*in.ring, 64, kBlockSize).ok());
  const Prompt p = MakePrompt(l.cfg.text.hidden_size, l.cfg.text.vocab_size);
  int steps = 0;
  std::vector<std::vector<float>> logits_seen;
  std::vector<int32_t> tokens_seen;
  absl::Status s = Generate(
      p, l.cfg.text.hidden_size, l.cfg.text.vocab_size,
      [&](const model::ForwardBatch& b, std::vector<float>* logits) {
        if (steps++ == 4) kill(rank1, SIGKILL);
        return ForwardOnAllRanks(*in.ring, m, **kv, b, EmbeddingPlacement::kInline, logits);
      },
      &logits_seen, &tokens_seen);
  INFO(s.ToString());
  CHECK(absl::IsUnavailable(s));
  CHECK(steps == 5);  // the step during which rank 1 died failed
  CHECK(WaitChild(rank1) == 128 + SIGKILL);
  // Out of service for good.
  std::vector<float> logits;
  CHECK(absl::IsUnavailable(ForwardOnAllRanks(*in.ring, m, **kv,
                                              MakeStep(p.tokens, {9, 6}, p, l.cfg.text.hidden_size),
                                              EmbeddingPlacement::kInline, &logits)));
  CHECK(access(("/dev/shm" + StepRingName(id)).c_str(), F_OK) != 0);
  CHECK(access(("/dev/shm" + ShmSegmentName(id)).c_str(), F_OK) != 0);
}

}  // namespace
}  // namespace mmserve::worker
