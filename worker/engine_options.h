// How an engine is built (LlmEngine::Create, LoadEngineModel) and the memory
// and capacity it decided at start. Plain values, but for the KV cache's
// placement (a function).
#ifndef MMSERVE_WORKER_ENGINE_OPTIONS_H_
#define MMSERVE_WORKER_ENGINE_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/kv_cache.h"

namespace mmserve::worker {

// Makes rank 0's KV cache of the shape the engine sized (kv_sizing.h),
// zeroed. Shared ownership: whatever backs the cache (a UCX segment, its
// context) stays until both the engine and the provider let go.
using KvCachePlacement =
    std::function<absl::StatusOr<std::shared_ptr<model::KvCache>>(const model::KvCacheShape&)>;

struct EngineOptions {
  std::string model_dir;
  int block_size = 16;
  int max_num_seqs = 32;
  int max_num_batched_tokens = 1024;
  std::optional<int> max_prefill_tokens;
  bool enable_chunked_prefill = true;
  bool enable_prefix_caching = true;
  // The scheduler's starvation bound for priorities
  // (scheduler::SchedulerConfig::priority_aging_steps).
  int priority_aging_steps = 128;
  // Longest prompt + completion; 0 = the model's max_position_embeddings,
  // capped at 8192.
  int max_model_len = 0;
  // KV cache size. 0: what the engine can use (max_num_seqs sequences of
  // max_model_len tokens), capped by kv_memory_fraction of the memory
  // available after loading and warm-up (MemAvailable in /proc/meminfo).
  // See kv_sizing.h.
  int64_t kv_cache_bytes = 0;
  double kv_memory_fraction = 0.3;
  int num_threads = 0;  // 0: one per core; negative is InvalidArgument
  // Weights quantized at load: "" or "none", "int8" (one scale per output
  // row), "int8_g32" (model::ParseQuantize; anything else is InvalidArgument
  // from Create). Covers the language model and the vision tower's linear
  // layers when it is loaded.
  std::string quantize;
  // Activations of the linear layers: "" or "f32" (fp32; int8 layers:
  // int16), "bf16" (rounded to bf16 at each bf16 layer, fp32 accumulation:
  // LinearKernel::kBf16Dot for the language model,
  // VisionTowerOptions::bf16_activations for the vision tower), "int8"
  // (int8 layers quantize their input to int8, one scale per 32 columns:
  // LinearKernel::kInt8Act, VisionTowerOptions::int8_activations); all
  // batch invariant. InvalidArgument from Create for anything else, for
  // "bf16" with a quantize setting or "int8" without one
  // (model::ParseActivationDtype), and for "bf16" with tp_size > 1 (the
  // shard ranks build their models with kDot; quantize is refused there).
  std::string activation_dtype;
  // Load the vision tower (vision models). A language service whose images
  // arrive as embeddings from an encoder service sets this false and passes
  // EngineRequest::image_embeddings instead of images.
  bool load_vision = true;
  // Tensor parallelism: tp_size > 1 makes this engine rank 0 of
  // tp_size rank processes on this host. It starts ranks 1.. from
  // tp_shard_binary (//worker:tp_shard), each with num_threads threads (as
  // rank 0; 0: the cores divided by tp_size), joined by the shared-memory
  // communicator and step ring named
  // tp_instance_id (unique per launch; empty: "engine-<pid>"). Needs
  // num_key_value_heads divisible by tp_size and no quantization.
  // kv_cache_bytes is per rank; with 0, each rank gets kv_memory_fraction of
  // MemAvailable / tp_size.
  int tp_size = 1;
  std::string tp_shard_binary;
  std::string tp_instance_id;
  // More flags for the shard ranks (TpGroupOptions::extra_args).
  std::vector<std::string> tp_shard_args;
  // Role prefill: the files the shard ranks' KV caches lie in, rank 1
  // first (TpGroupOptions::kv_fds), or empty.
  std::vector<int> tp_shard_kv_fds;
  // Seed 000: memory every rank maps (a worker::ShmFile: its descriptor,
  // and where it lies in this process), which must outlive the engine. With
  // tp_size > 1, a step's image rows whose values lie in it reach the other
  // ranks as descriptors (offset, length, content hash); any other rows
  // travel inline in the step. Unset (-1): every row travels inline.
  int shared_input_fd = -1;
  const uint8_t* shared_input = nullptr;
  size_t shared_input_bytes = 0;
  // Where rank 0's KV cache lives. Unset: private memory the engine owns.
  // Role decode places it in memory prefill instances write into (on the
  // shm profile a segment they map: language_service/decode_role.h). Called
  // once, after the warm-up; its error fails the engine's Create.
  KvCachePlacement kv_cache_placement;
};

// Memory and capacity decided at start, for logs and benchmarks.
struct EngineSizing {
  size_t weights_bytes = 0;
  size_t vision_bytes = 0;
  int64_t warmup_rss_growth_bytes = 0;
  size_t kv_bytes = 0;
  int num_kv_blocks = 0;
  int max_model_len = 0;
  // The context before max_model_len was lowered to what one KV pool holds:
  // the limit of a prompt an elastic group spreads over several pools.
  int context_len = 0;
};

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_ENGINE_OPTIONS_H_
