// Tensor parallelism: the model sharded over 2 (and 4) rank
// processes, joined by the shared-memory communicator, against the same
// model on one rank, on every golden model whose KV heads split evenly and
// on random bf16 weights; and the refusal of models whose KV heads do not.
//
// The ranks are forked processes. Rank 0 (this process) picks each greedy
// token and broadcasts it, as the engine's rank 0 would send it in the step.
// Tolerance: fp32 logits within 1e-4 of one rank's. The row-parallel o_proj
// and down_proj sum n partial dot products instead of one chain, so results
// differ from one rank's by rounding only (measured below 1e-5 here).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "model/cpu/thread_pool.h"
#include "model/model_config.h"
#include "model/qwen2_model.h"
#include "model/qwen2_test_runner.h"
#include "model/qwen2_weights.h"
#include "model/safetensors.h"
#include "worker/fork_ranks.h"
#include "worker/shm_communicator.h"

namespace mmserve::model {
namespace {

constexpr float kTolerance = 1e-4f;
constexpr int kDecodeSteps = 16;

const char* const kModelDirs[] = {
    "model/testdata/models/qwen2vl-tiny-mha-tied",
    "model/testdata/models/qwen2vl-tiny-mqa-bf16",
    "model/testdata/models/qwen2vl-tiny-gqa2-untied-sharded",
    "model/testdata/models/qwen2vl-tiny-gqa8-padvocab-nested",
    "models/shapes-demo",
    "model/testdata/models/qwen3-tiny-qknorm",
    "model/testdata/models/qwen3-tiny-bias",
    "model/testdata/models/qwen3moe-tiny-top2",
    "model/testdata/models/qwen3moe-tiny-top3-dense0",
    "model/testdata/models/qwen3vlmoe-tiny",
};

// Everything rank 0 saw: every logits row (prompt rows, then each decode
// step's rows), and the greedy tokens.
struct Trace {
  std::vector<std::vector<float>> rows;
  std::vector<int32_t> tokens;
};

// Three prompts prefilled in one step (every row's logits), then
// kDecodeSteps batched greedy steps. comm: null for one rank.
absl::StatusOr<Trace> Drive(Qwen2Model& model, mmserve::Communicator* comm) {
  const int64_t vocab = model.config().vocab_size;
  TestRunner runner(model, /*num_blocks=*/128, /*block_size=*/4);
  std::vector<int> seqs;
  for (int64_t len : {5, 13, 37}) {
    std::vector<int32_t> prompt;
    for (int64_t i = 0; i < len; ++i)
      prompt.push_back(static_cast<int32_t>((i * 37 + len) % vocab));
    seqs.push_back(runner.AddSequence(prompt));
  }
  Trace trace;
  std::vector<std::pair<int, int64_t>> work;
  for (int s : seqs) work.push_back({s, runner.Uncached(s)});
  bool all_rows = true;
  for (int step = 0; step <= kDecodeSteps; ++step) {
    auto out = runner.Step(work, all_rows);
    if (!out.ok()) return out.status();
    all_rows = false;
    std::vector<float> next(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      for (auto& row : (*out)[i]) trace.rows.push_back(row);
      if (!(*out)[i].empty()) next[i] = static_cast<float>(GreedyToken((*out)[i].back(), {}));
    }
    if (comm != nullptr) RETURN_IF_ERROR(comm->Broadcast(absl::MakeSpan(next)));
    work.clear();
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int32_t token = static_cast<int32_t>(next[i]);
      trace.tokens.push_back(token);
      runner.Append(seqs[i], token);
      work.push_back({seqs[i], 1});
    }
  }
  return trace;
}

// Weights from a checkpoint directory or, when dir is empty, at random.
struct Source {
  std::string dir;
  TextConfig random_cfg;
  DType random_dtype = DType::kBF16;
};

struct Loaded {
  TextConfig cfg;
  std::unique_ptr<SafetensorsCheckpoint> ckpt;
  std::unique_ptr<Qwen2Weights> weights;
};

absl::StatusOr<Loaded> LoadShard(const Source& src, TensorParallelShard shard) {
  Loaded l;
  Qwen2WeightsOptions o;
  o.shard = shard;
  if (src.dir.empty()) {
    l.cfg = src.random_cfg;
    l.weights = Qwen2Weights::Random(l.cfg, src.random_dtype, /*seed=*/7, o);
    return l;
  }
  ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(src.dir));
  l.cfg = cfg.text;
  ASSIGN_OR_RETURN(l.ckpt, SafetensorsCheckpoint::Open(src.dir));
  ASSIGN_OR_RETURN(l.weights, Qwen2Weights::Load(*l.ckpt, l.cfg, o));
  return l;
}

Trace OneRank(const Source& src) {
  auto l = LoadShard(src, {0, 1});
  REQUIRE(l.ok());
  cpu::ThreadPool pool(2);
  Qwen2Model model(l->cfg, *l->weights, pool);
  auto trace = Drive(model, nullptr);
  REQUIRE(trace.ok());
  return *std::move(trace);
}

// Runs the model over `world` forked ranks (one thread each) and compares
// rank 0's trace with `want`. Call with no thread pool alive.
void CheckParallel(const Source& src, int world, const Trace& want, const std::string& label) {
  const std::string id = worker::UniqueInstanceId("tp-parity");
  float worst = 0;
  bool same_tokens = false;
  size_t rows = 0;
  std::vector<int> codes = worker::RunForkedRanks(world, [&](int rank) {
    worker::ShmCommunicatorOptions co;
    co.instance_id = id;
    co.rank = rank;
    co.world_size = world;
    co.capacity_floats = 4096;  // prefill rows go in several chunks
    co.timeout = absl::Seconds(30);
    auto comm = worker::ShmCommunicator::Join(co);
    if (!comm.ok()) return 10;
    auto l = LoadShard(src, {rank, world});
    if (!l.ok()) return 11;
    cpu::ThreadPool pool(1);
    Qwen2ModelOptions mo;
    mo.comm = comm->get();
    Qwen2Model model(l->cfg, *l->weights, pool, mo);
    auto trace = Drive(model, comm->get());
    if (!trace.ok()) return 12;
    if (rank != 0) return trace->rows.empty() && trace->tokens == want.tokens ? 0 : 13;
    rows = trace->rows.size();
    if (rows != want.rows.size()) return 14;
    for (size_t r = 0; r < rows; ++r) {
      if (trace->rows[r].size() != want.rows[r].size()) return 15;
      for (size_t i = 0; i < want.rows[r].size(); ++i) {
        worst = std::max(worst, std::fabs(trace->rows[r][i] - want.rows[r][i]));
      }
    }
    same_tokens = trace->tokens == want.tokens;
    return 0;
  });
  std::printf("tp parity %-58s TP=%d: %zu logits rows, max|dlogit| %.3g, greedy %s\n",
              label.c_str(), world, rows, worst, same_tokens ? "identical" : "DIFFERENT");
  INFO(label << " TP=" << world);
  CHECK(codes == std::vector<int>(world, 0));
  CHECK(rows == want.rows.size());
  CHECK(worst <= kTolerance);
  CHECK(same_tokens);
  CHECK(access(("/dev/shm" + worker::ShmSegmentName(id)).c_str(), F_OK) != 0);
}

TEST_CASE("TP=2 matches TP=1 on every golden model whose KV heads split; the others are refused",
          "[tp]") {
  int compared = 0, refused = 0;
  for (const char* dir : kModelDirs) {
    auto cfg = LoadModelConfig(dir);
    REQUIRE(cfg.ok());
    INFO(dir);
    if (cfg->text.num_key_value_heads % 2 != 0) {
      auto l = LoadShard({dir}, {0, 2});
      CHECK(absl::IsInvalidArgument(l.status()));
      CHECK(l.status().message().find("num_key_value_heads") != std::string::npos);
      ++refused;
      continue;
    }
    const Trace want = OneRank({dir});
    CheckParallel({dir}, 2, want, dir);
    if (cfg->text.num_key_value_heads % 4 == 0) CheckParallel({dir}, 4, want, dir);
    ++compared;
  }
  // mha-tied, shapes-demo, qwen3-tiny-qknorm, the two Qwen3-MoE ones and
  // Qwen3-VL-MoE's language model (each expert split like the dense MLP,
  // fused experts as well) run; the MQA (1 KV head) and 3-KV-head ones are
  // refused at TP=2.
  CHECK(compared == 6);
  CHECK(refused == 4);
  // Qwen3 with attention_bias: o_proj's bias is added once, after the sum
  // over ranks (3 KV heads split over 3 ranks).
  const std::string bias = "model/testdata/models/qwen3-tiny-bias";
  CheckParallel({bias}, 3, OneRank({bias}), bias);
}

TEST_CASE("TP=2 matches TP=1 on random bf16 weights, tied and untied", "[tp]") {
  auto demo = LoadModelConfig("models/shapes-demo");
  REQUIRE(demo.ok());
  for (bool tied : {true, false}) {
    Source src;
    src.random_cfg = demo->text;
    src.random_cfg.tie_word_embeddings = tied;
    src.random_cfg.vocab_size = 1037;  // odd: rank 1's vocabulary slice is shorter
    const Trace want = OneRank(src);
    CheckParallel(src, 2, want, tied ? "random bf16, tied" : "random bf16, untied");
  }
}

TEST_CASE("one rank with a one-rank communicator is bitwise the plain model", "[tp]") {
  const Source src{"models/shapes-demo"};
  const Trace plain = OneRank(src);
  auto comm = worker::ShmCommunicator::Join({worker::UniqueInstanceId("tp1"), 0, 1});
  REQUIRE(comm.ok());
  auto l = LoadShard(src, {0, 1});
  REQUIRE(l.ok());
  cpu::ThreadPool pool(2);
  Qwen2ModelOptions mo;
  mo.comm = comm->get();
  Qwen2Model model(l->cfg, *l->weights, pool, mo);
  auto trace = Drive(model, comm->get());
  REQUIRE(trace.ok());
  CHECK(trace->rows == plain.rows);
  CHECK(trace->tokens == plain.tokens);
}

TEST_CASE("bad tensor-parallel shards are refused with INVALID_ARGUMENT", "[tp]") {
  const std::string dir = "models/shapes-demo";  // 2 KV heads, intermediate 384
  CHECK(absl::IsInvalidArgument(LoadShard({dir}, {2, 2}).status()));
  CHECK(absl::IsInvalidArgument(LoadShard({dir}, {-1, 2}).status()));
  CHECK(absl::IsInvalidArgument(LoadShard({dir}, {0, 0}).status()));
  auto three = LoadShard({dir}, {0, 3});
  CHECK(absl::IsInvalidArgument(three.status()));
  CHECK(three.status().message().find("num_key_value_heads 2") != std::string::npos);
  // int8 per-row scales of a column slice would not be TP=1's.
  auto cfg = LoadModelConfig(dir);
  REQUIRE(cfg.ok());
  auto ckpt = SafetensorsCheckpoint::Open(dir);
  REQUIRE(ckpt.ok());
  Qwen2WeightsOptions o;
  o.quantize = Quantization::kInt8;
  o.shard = {0, 2};
  CHECK(absl::IsInvalidArgument(Qwen2Weights::Load(**ckpt, cfg->text, o).status()));
}

}  // namespace
}  // namespace mmserve::model
