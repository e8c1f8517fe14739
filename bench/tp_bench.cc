// Tensor parallelism on the CPU: decode throughput of a TP=2
// instance (two rank processes, one compute thread each, joined by the
// shared-memory communicator) against TP=1 (one process, two threads) on
// the same random weights, and the communicator's all-reduce latency
// against memcpy of the same bytes.
//
//   bazel run --config=opt //bench:tp_bench -- --dims=qwen2-0.5b
//
// Both run in this one invocation: rank 0 is this process and also runs the
// TP=1 model; rank 1 is a forked child that runs the TP=2 steps in the same
// order (the batches are deterministic, so no step needs sending). Decode
// chunks of --steps steps alternate TP=1, TP=2 for batch 1 and batch 16, so
// both see the same machine load; tok/s sums the chunks. While rank 0 runs
// TP=1, rank 1 sleeps in its next all-reduce (futex wait).
// All-reduce latency: the median of --reps calls of AllReduceSum of one
// hidden vector and of 16, against the median memcpy of as many bytes in
// this process. comm_share_b<B> = 2 x layers x that all-reduce time / the
// TP=2 step time: the share of a decode step spent in the communicator
// (lm_head's gather not counted).
// Prints a human table, then one JSON line last.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "bench/qwen2_dims.h"
#include "common/clock.h"
#include "common/logging.h"
#include "model/cpu/thread_pool.h"
#include "model/kv_cache.h"
#include "model/qwen2_model.h"
#include "model/qwen2_weights.h"
#include "worker/shm_communicator.h"

ABSL_FLAG(std::string, dims, "qwen2-0.5b", "random weights at these dimensions: qwen2-0.5b, tiny");
ABSL_FLAG(int, steps, 16, "decode steps per timed chunk");
ABSL_FLAG(int, chunks, 4, "timed chunks per mode and batch size");
ABSL_FLAG(int, reps, 2000, "all-reduce and memcpy calls per latency figure");

namespace mmserve {
namespace {

using model::ForwardBatch;
using model::TextConfig;
namespace cpu = model::cpu;

constexpr int kBatches[] = {1, 16};
constexpr int64_t kBlockSize = 16;

TextConfig Dims(const std::string& name) {
  TextConfig cfg = Qwen2HalfBDims();
  if (name == "qwen2-0.5b") {
    return cfg;
  } else if (name == "tiny") {
    cfg.vocab_size = 2048;
    cfg.hidden_size = 128;
    cfg.intermediate_size = 256;
    cfg.num_hidden_layers = 2;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
  } else {
    LOG(FATAL) << "unknown --dims " << name;
  }
  return cfg;
}

// One decode step of `batch` sequences at cache position `pos`, sequence s
// in blocks [s * blocks_per_seq, ...); token ids from the seed.
ForwardBatch DecodeBatch(int batch, int64_t pos, int64_t blocks_per_seq, int64_t vocab) {
  ForwardBatch b;
  for (int s = 0; s < batch; ++s) {
    model::SequenceChunk chunk{s, 1, pos + 1, {}};
    for (int64_t blk = 0; blk * kBlockSize < pos + 1; ++blk) {
      chunk.block_table.push_back(static_cast<int32_t>(s * blocks_per_seq + blk));
    }
    b.token_ids.push_back(static_cast<int32_t>((pos * 7919 + s * 104729) % vocab));
    b.slot_mapping.push_back((s * blocks_per_seq + pos / kBlockSize) * kBlockSize +
                             pos % kBlockSize);
    b.logits_rows.push_back(s);
    b.sequences.push_back(std::move(chunk));
  }
  for (int c = 0; c < 3; ++c) {
    for (int s = 0; s < batch; ++s) b.positions.push_back(pos);
  }
  return b;
}

// A model with its KV cache, stepping through decode positions.
class Decoder {
 public:
  Decoder(const TextConfig& cfg, const model::Qwen2Weights& w, int threads,
          mmserve::Communicator* comm, int64_t max_pos)
      : cfg_(cfg), pool_(threads), model_(cfg, w, pool_, {cpu::LinearKernel::kDot, comm}) {
    blocks_per_seq_ = (max_pos + kBlockSize - 1) / kBlockSize;
    auto kv = model::KvCache::Create(model_.KvShape(blocks_per_seq_ * 16, kBlockSize));
    CHECK_OK(kv.status());
    kv_ = std::move(kv).value();
  }

  // `steps` decode steps of `batch` sequences; positions wrap at max_pos.
  void Run(int batch, int steps, int64_t max_pos) {
    for (int i = 0; i < steps; ++i) {
      int64_t& pos = pos_[batch];
      ForwardBatch b = DecodeBatch(batch, pos, blocks_per_seq_, cfg_.vocab_size);
      CHECK_OK(model_.Forward(b, *kv_, &logits_));
      pos = (pos + 1) % max_pos;
    }
  }

 private:
  TextConfig cfg_;
  cpu::ThreadPool pool_;
  model::Qwen2Model model_;
  std::unique_ptr<model::KvCache> kv_;
  int64_t blocks_per_seq_ = 0;
  int64_t pos_[17] = {};
  std::vector<float> logits_;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median microseconds of AllReduceSum over n floats (every rank calls it).
double AllReduceMicros(mmserve::Communicator& comm, int64_t n, int reps) {
  std::vector<float> data(n, 1.0f);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    Stopwatch sw;
    CHECK_OK(comm.AllReduceSum(absl::MakeSpan(data)));
    t.push_back(sw.ElapsedMicros());
    std::fill(data.begin(), data.end(), 1.0f);
  }
  return Median(t);
}

double MemcpyMicros(int64_t n, int reps) {
  std::vector<float> a(n, 1.0f), b(n);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    a[i % n] = static_cast<float>(i);
    Stopwatch sw;
    std::memcpy(b.data(), a.data(), n * sizeof(float));
    asm volatile("" : : "r"(b.data()) : "memory");
    t.push_back(sw.ElapsedMicros());
  }
  return Median(t);
}

struct Plan {
  TextConfig cfg;
  int steps, chunks, reps;
  int64_t max_pos;
};

std::unique_ptr<worker::ShmCommunicator> Join(const std::string& id, int rank) {
  worker::ShmCommunicatorOptions o;
  o.instance_id = id;
  o.rank = rank;
  o.world_size = 2;
  o.timeout = absl::Seconds(600);  // rank 1 waits out rank 0's TP=1 chunks
  auto comm = worker::ShmCommunicator::Join(o);
  CHECK_OK(comm.status());
  return std::move(comm).value();
}

std::unique_ptr<model::Qwen2Weights> Weights(const TextConfig& cfg, int rank, int size) {
  model::Qwen2WeightsOptions o;
  o.shard = {rank, size};
  return model::Qwen2Weights::Random(cfg, model::DType::kBF16, /*seed=*/1, o);
}

// Rank 1: mirrors rank 0's collective calls and TP=2 steps.
int RunRank1(const Plan& p, const std::string& id) {
  auto comm = Join(id, 1);
  auto w = Weights(p.cfg, 1, 2);
  for (int64_t n : {p.cfg.hidden_size, 16 * p.cfg.hidden_size}) {
    AllReduceMicros(*comm, n, p.reps);
  }
  Decoder tp2(p.cfg, *w, 1, comm.get(), p.max_pos);
  for (int chunk = 0; chunk <= p.chunks; ++chunk) {
    for (int batch : kBatches) tp2.Run(batch, p.steps, p.max_pos);
  }
  return 0;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  Plan p;
  p.cfg = Dims(absl::GetFlag(FLAGS_dims));
  p.steps = absl::GetFlag(FLAGS_steps);
  p.chunks = absl::GetFlag(FLAGS_chunks);
  p.reps = absl::GetFlag(FLAGS_reps);
  p.max_pos = 256;
  const std::string id = absl::StrFormat("tp-bench-%d", getpid());
  std::fflush(nullptr);
  const pid_t child = fork();
  CHECK_GE(child, 0);
  if (child == 0) _exit(RunRank1(p, id));

  auto comm = Join(id, 0);
  const int64_t hidden = p.cfg.hidden_size;
  double ar_us[2], cp_us[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t n = (i == 0 ? 1 : 16) * hidden;
    ar_us[i] = AllReduceMicros(*comm, n, p.reps);
    cp_us[i] = MemcpyMicros(n, p.reps);
  }
  auto w1 = Weights(p.cfg, 0, 1);
  auto w2 = Weights(p.cfg, 0, 2);
  Decoder tp1(p.cfg, *w1, 2, nullptr, p.max_pos);
  Decoder tp2(p.cfg, *w2, 1, comm.get(), p.max_pos);
  double tp1_s[17] = {}, tp2_s[17] = {};
  for (int chunk = 0; chunk <= p.chunks; ++chunk) {  // chunk 0 warms up
    for (int batch : kBatches) {
      Stopwatch a;
      tp1.Run(batch, p.steps, p.max_pos);
      const double t1 = a.ElapsedSeconds();
      Stopwatch b;
      tp2.Run(batch, p.steps, p.max_pos);
      const double t2 = b.ElapsedSeconds();
      if (chunk > 0) {
        tp1_s[batch] += t1;
        tp2_s[batch] += t2;
      }
    }
  }
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank 1 failed: " << status;

  const double steps = static_cast<double>(p.steps) * p.chunks;
  std::printf("tp_bench: %s dims, bf16 random weights, %d chunks x %d decode steps\n",
              absl::GetFlag(FLAGS_dims).c_str(), p.chunks, p.steps);
  std::printf("%-8s %14s %14s %10s %14s\n", "batch", "TP=1 tok/s", "TP=2 tok/s", "TP2/TP1",
              "comm share");
  double ratio[17] = {}, share[17] = {}, tok1[17] = {}, tok2[17] = {};
  for (int batch : kBatches) {
    tok1[batch] = batch * steps / tp1_s[batch];
    tok2[batch] = batch * steps / tp2_s[batch];
    ratio[batch] = tok2[batch] / tok1[batch];
    const double step_us = tp2_s[batch] / steps * 1e6;
    share[batch] = 2.0 * p.cfg.num_hidden_layers * ar_us[batch == 1 ? 0 : 1] / step_us;
    std::printf("%-8d %14.1f %14.1f %10.3f %14.3f\n", batch, tok1[batch], tok2[batch], ratio[batch],
                share[batch]);
  }
  std::printf("%-22s %12s %12s %10s\n", "all-reduce of", "shm us", "memcpy us", "ratio");
  std::printf("%-22s %12.2f %12.3f %10.1f\n", "1 hidden vector", ar_us[0], cp_us[0],
              ar_us[0] / cp_us[0]);
  std::printf("%-22s %12.2f %12.3f %10.1f\n", "16 hidden vectors", ar_us[1], cp_us[1],
              ar_us[1] / cp_us[1]);
  std::printf(
      "{\"bench\":\"tp_bench\",\"dims\":\"%s\",\"steps\":%d,\"chunks\":%d,"
      "\"tp1_tok_s_b1\":%.2f,\"tp2_tok_s_b1\":%.2f,\"tp1_tok_s_b16\":%.2f,\"tp2_tok_s_b16\":%.2f,"
      "\"tp2_vs_tp1_b1\":%.3f,\"tp2_vs_tp1_b16\":%.3f,\"comm_share_b1\":%.4f,"
      "\"comm_share_b16\":%.4f,\"allreduce_us_1x\":%.3f,\"memcpy_us_1x\":%.4f,"
      "\"allreduce_vs_memcpy_1x\":%.2f,\"allreduce_us_16x\":%.3f,\"memcpy_us_16x\":%.4f,"
      "\"allreduce_vs_memcpy_16x\":%.2f}\n",
      absl::GetFlag(FLAGS_dims).c_str(), p.steps, p.chunks, tok1[1], tok2[1], tok1[16], tok2[16],
      ratio[1], ratio[16], share[1], share[16], ar_us[0], cp_us[0], ar_us[0] / cp_us[0], ar_us[1],
      cp_us[1], ar_us[1] / cp_us[1]);
  return 0;
}

}  // namespace
}  // namespace mmserve

int main(int argc, char** argv) { return mmserve::Main(argc, argv); }
