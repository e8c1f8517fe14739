#include "worker/engine_load.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/kv_sizing.h"
#include "worker/tp_step_loop.h"

namespace mmserve::worker {
namespace {

constexpr int kMaxModelLenCap = 8192;

// A /proc value in kB ("VmRSS:" in /proc/self/status, "MemAvailable:" in
// /proc/meminfo), in bytes; 0 when unreadable.
int64_t ProcBytes(const char* file, const char* key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + std::strlen(key)) * 1024;
  }
  return 0;
}

// The largest step the scheduler can make, encoded (step_message.h): every
// row an image row with its embedding (row_width floats: with Qwen3-VL's
// DeepStack features) inline, every sequence's block table as long as
// max_model_len needs.
int64_t StepSlotBytes(const EngineOptions& o, int64_t row_width, int64_t max_model_len) {
  const int64_t rows = o.max_num_batched_tokens;
  const int64_t blocks_per_seq = (max_model_len + o.block_size - 1) / o.block_size + 1;
  // Per row: token id, 3 positions, slot, logits row, embedding descriptor
  // and values; per sequence: its chunk and block table; and the header.
  const int64_t bytes = 1024 + rows * (4 + 3 * 8 + 8 + 8 + 48 + row_width * 4) +
                        o.max_num_seqs * (32 + blocks_per_seq * 4);
  return (bytes + 63) / 64 * 64;
}

absl::Status CheckOptions(const EngineOptions& options) {
  if (options.num_threads < 0 || options.kv_cache_bytes < 0 || options.block_size <= 0 ||
      options.max_num_seqs <= 0 || options.max_num_batched_tokens <= 0 ||
      options.max_model_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine options out of range: num_threads ", options.num_threads,
                     " (>= 0), kv_cache_bytes ", options.kv_cache_bytes, " (>= 0), block_size ",
                     options.block_size, " (> 0), max_num_seqs ", options.max_num_seqs,
                     " (> 0), max_num_batched_tokens ", options.max_num_batched_tokens,
                     " (> 0), max_model_len ", options.max_model_len, " (>= 0)"));
  }
  return model::ParseActivationDtype(options.activation_dtype, options.quantize).status();
}

// Ranks 1..tp_size-1, each with `threads` threads, after checking that the
// model splits (before any rank starts).
absl::Status StartRanks(const EngineOptions& options, int threads,
                        model::Qwen2WeightsOptions& weight_options, EngineModel& m) {
  weight_options.shard = {0, options.tp_size};
  RETURN_IF_ERROR(model::CheckTensorParallel(m.config.text, weight_options.shard));
  if (weight_options.quantize != model::Quantization::kNone) {
    return absl::InvalidArgumentError("--quantize is not supported with tensor parallelism");
  }
  TpGroupOptions g;
  g.size = options.tp_size;
  g.instance_id =
      options.tp_instance_id.empty() ? absl::StrCat("engine-", getpid()) : options.tp_instance_id;
  g.shard_binary = options.tp_shard_binary;
  g.model_dir = options.model_dir;
  g.threads_per_rank = threads;
  g.ring_slot_bytes = StepSlotBytes(options, m.config.EmbeddingRowWidth(), m.sizing.max_model_len);
  g.extra_args = options.tp_shard_args;
  g.kv_fds = options.tp_shard_kv_fds;
  if (options.shared_input != nullptr) {
    g.shared_input_fd = options.shared_input_fd;
    g.shared_input_bytes = options.shared_input_bytes;
  }
  ASSIGN_OR_RETURN(m.tp_group, TpGroup::Start(g));
  return absl::OkStatus();
}

// The checkpoint, the language model's weights, the vision tower (when
// loaded) and the model over them.
absl::Status LoadWeights(const EngineOptions& options, int threads,
                         const model::Qwen2WeightsOptions& weight_options, EngineModel& m) {
  ASSIGN_OR_RETURN(const model::ActivationDtype activations,
                   model::ParseActivationDtype(options.activation_dtype, options.quantize));
  const bool bf16 = activations == model::ActivationDtype::kBf16;
  const bool int8 = activations == model::ActivationDtype::kInt8;
  ASSIGN_OR_RETURN(m.checkpoint, model::SafetensorsCheckpoint::Open(options.model_dir));
  ASSIGN_OR_RETURN(m.weights,
                   model::Qwen2Weights::Load(*m.checkpoint, m.config.text, weight_options));
  m.sizing.weights_bytes = m.weights->TotalWeightBytes();
  m.pool = std::make_unique<model::cpu::ThreadPool>(threads);
  if (m.config.vision && options.load_vision) {
    model::VisionTowerOptions vision_options;
    vision_options.pool = m.pool.get();
    // --quantize covers the vision tower's linear layers too (int8 only: with
    // the 4-bit schemes the tower stays as stored).
    if (weight_options.quantize == model::Quantization::kInt8) {
      vision_options.int8_group = weight_options.int8_group;
    }
    vision_options.bf16_activations = bf16;
    vision_options.int8_activations = int8;
    ASSIGN_OR_RETURN(m.vision, model::VisionTower::Load(*m.checkpoint, m.config, vision_options));
    m.sizing.vision_bytes = m.vision->weight_bytes();
  }
  model::Qwen2ModelOptions model_options;
  if (bf16) model_options.linear_kernel = model::cpu::LinearKernel::kBf16Dot;
  if (int8) model_options.linear_kernel = model::cpu::LinearKernel::kInt8Act;
  if (m.tp_group != nullptr) model_options.comm = m.tp_group->comm();
  m.model = std::make_unique<model::Qwen2Model>(m.config.text, *m.weights, *m.pool, model_options);
  return absl::OkStatus();
}

absl::Status Load(const EngineOptions& options, EngineModel& m) {
  RETURN_IF_ERROR(CheckOptions(options));
  ASSIGN_OR_RETURN(m.config, model::LoadModelConfig(options.model_dir));
  ASSIGN_OR_RETURN(m.tokenizer, model::Tokenizer::FromFile(options.model_dir + "/tokenizer.json"));
  if (m.tokenizer->vocab_size() > m.config.text.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer has ", m.tokenizer->vocab_size(),
                                                   " tokens, the model's vocab_size is ",
                                                   m.config.text.vocab_size));
  }
  ASSIGN_OR_RETURN(model::Qwen2WeightsOptions weight_options,
                   model::ParseQuantize(options.quantize));
  if (options.tp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel size ", options.tp_size, " must be >= 1"));
  }
  ASSIGN_OR_RETURN(const model::ActivationDtype activations,
                   model::ParseActivationDtype(options.activation_dtype, options.quantize));
  if (activations == model::ActivationDtype::kBf16 && options.tp_size > 1) {
    // The shard ranks (tp_shard_main) build their models with kDot.
    return absl::InvalidArgumentError(
        "--activation_dtype=bf16 is not supported with tensor parallelism");
  }
  const int threads =
      options.num_threads > 0
          ? options.num_threads
          // Every rank runs on this host: share the cores between them.
          : std::max(1, model::cpu::ThreadPool::DefaultThreads() / std::max(1, options.tp_size));
  const int positions = m.config.text.max_position_embeddings;
  m.sizing.max_model_len =
      options.max_model_len > 0
          ? options.max_model_len
          : std::min(positions > 0 ? positions : kMaxModelLenCap, kMaxModelLenCap);
  m.sizing.context_len = m.sizing.max_model_len;
  if (options.tp_size > 1) RETURN_IF_ERROR(StartRanks(options, threads, weight_options, m));
  RETURN_IF_ERROR(LoadWeights(options, threads, weight_options, m));
  for (int id : m.config.tokens.eos) m.eos_ids.push_back(id);
  for (int id : m.config.generation.eos_token_ids) {
    if (std::find(m.eos_ids.begin(), m.eos_ids.end(), id) == m.eos_ids.end()) {
      m.eos_ids.push_back(id);
    }
  }
  m.image_pad_id = m.config.tokens.image_pad >= 0 ? m.config.tokens.image_pad
                                                  : m.tokenizer->TokenToId("<|image_pad|>");
  m.video_pad_id = m.config.tokens.video_pad >= 0 ? m.config.tokens.video_pad
                                                  : m.tokenizer->TokenToId("<|video_pad|>");
  return absl::OkStatus();
}

// The largest step the scheduler can produce, so every scratch buffer
// reaches its peak before the KV budget is measured; records the RSS growth.
absl::Status WarmUp(const EngineOptions& options, EngineModel& m) {
  const int bs = options.block_size;
  const int warm_tokens = options.max_num_batched_tokens;
  const int warm_blocks = (warm_tokens + bs - 1) / bs;
  ASSIGN_OR_RETURN(auto warm_kv, model::KvCache::Create(m.model->KvShape(warm_blocks, bs)));
  model::ForwardBatch b;
  model::SequenceChunk chunk;
  chunk.query_len = chunk.context_len = warm_tokens;
  for (int i = 0; i < warm_blocks; ++i) chunk.block_table.push_back(i);
  b.sequences.push_back(chunk);
  for (int t = 0; t < warm_tokens; ++t) {
    b.token_ids.push_back(0);
    b.slot_mapping.push_back(t);
  }
  for (int c = 0; c < 3; ++c) {
    for (int t = 0; t < warm_tokens; ++t) b.positions.push_back(t);
  }
  b.logits_rows.push_back(warm_tokens - 1);
  const int64_t rss_before = ProcBytes("/proc/self/status", "VmRSS:");
  std::vector<float> logits;
  if (m.tp_group != nullptr) {
    StepRing& ring = *m.tp_group->ring();
    RETURN_IF_ERROR(AllocateKvOnAllRanks(ring, warm_blocks, bs));
    RETURN_IF_ERROR(
        ForwardOnAllRanks(ring, *m.model, *warm_kv, b, EmbeddingPlacement::kInline, &logits));
  } else {
    RETURN_IF_ERROR(m.model->Forward(b, *warm_kv, &logits));
  }
  m.sizing.warmup_rss_growth_bytes = ProcBytes("/proc/self/status", "VmRSS:") - rss_before;
  return absl::OkStatus();
}

// The KV cache (on every rank) from the memory left after the warm-up.
absl::Status SizeKvCache(const EngineOptions& options, EngineModel& m) {
  const int bs = options.block_size;
  KvSizingInputs in;
  in.block_size = bs;
  in.max_num_seqs = options.max_num_seqs;
  in.max_model_len = m.sizing.max_model_len;
  in.block_bytes = m.model->KvShape(1, bs).TotalBytes();
  in.requested_bytes = static_cast<size_t>(options.kv_cache_bytes);
  // Every rank allocates a cache of num_blocks blocks of its own heads on
  // this host: each gets its share of the memory.
  in.available_bytes = ProcBytes("/proc/meminfo", "MemAvailable:") / std::max(1, options.tp_size);
  in.memory_fraction = options.kv_memory_fraction;
  ASSIGN_OR_RETURN(KvSizing kv_sizing, DecideKvBlocks(in));
  const int num_blocks = kv_sizing.num_blocks;
  LOG(INFO) << "engine: " << kv_sizing.Describe();
  if (static_cast<int64_t>(num_blocks) * bs < m.sizing.max_model_len) {
    LOG(WARNING) << "KV cache holds " << num_blocks * bs << " tokens; max_model_len lowered from "
                 << m.sizing.max_model_len;
    m.sizing.max_model_len = num_blocks * bs;
  }
  const model::KvCacheShape shape = m.model->KvShape(num_blocks, bs);
  if (options.kv_cache_placement) {
    ASSIGN_OR_RETURN(m.kv, options.kv_cache_placement(shape));
    if (m.kv == nullptr || m.kv->shape().num_blocks != num_blocks ||
        m.kv->bytes() != shape.TotalBytes()) {
      return absl::InternalError("the KV cache placement made no cache of the sized shape");
    }
  } else {
    ASSIGN_OR_RETURN(m.kv, model::KvCache::Create(shape));
  }
  if (m.tp_group != nullptr) {
    RETURN_IF_ERROR(AllocateKvOnAllRanks(*m.tp_group->ring(), num_blocks, bs));
  }
  m.sizing.num_kv_blocks = num_blocks;
  m.sizing.kv_bytes = m.kv->shape().TotalBytes();
  auto mib = [](double bytes) { return absl::StrFormat("%.1f MiB", bytes / (1 << 20)); };
  LOG(INFO) << "engine: weights " << mib(m.sizing.weights_bytes) << ", vision "
            << mib(m.sizing.vision_bytes) << ", warm-up activations "
            << mib(m.sizing.warmup_rss_growth_bytes) << ", KV " << num_blocks << " blocks x " << bs
            << " tokens = " << mib(m.sizing.kv_bytes) << ", max_model_len "
            << m.sizing.max_model_len;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<EngineModel>> LoadEngineModel(const EngineOptions& options) {
  auto m = std::make_unique<EngineModel>();
  RETURN_IF_ERROR(Load(options, *m));
  RETURN_IF_ERROR(WarmUp(options, *m));
  RETURN_IF_ERROR(SizeKvCache(options, *m));
  return m;
}

}  // namespace mmserve::worker
