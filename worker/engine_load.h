// An engine's start (after nano-vllm's model runner set-up): the options
// checked, the tensor-parallel ranks started (tp_size > 1), the weights and
// the vision tower loaded, a warm-up forward at the largest step the
// scheduler can make, and the KV cache sized from the memory left
// after it (kv_sizing.h).
//
//   ASSIGN_OR_RETURN(std::unique_ptr<EngineModel> m, LoadEngineModel(options));
//   m->model->Forward(batch, *m->kv, &logits);
//
// Not thread-safe; the result is owned by one engine.
#ifndef MMSERVE_WORKER_ENGINE_LOAD_H_
#define MMSERVE_WORKER_ENGINE_LOAD_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "model/cpu/thread_pool.h"
#include "model/kv_cache.h"
#include "model/model_config.h"
#include "model/qwen2_model.h"
#include "model/qwen2_weights.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "model/vision_tower.h"
#include "worker/engine_options.h"
#include "worker/tp_group.h"

namespace mmserve::worker {

// What an engine loaded, in construction order (destroyed in reverse: the
// model before its thread pool and ranks, the weights before the
// checkpoint they may map).
struct EngineModel {
  model::ModelConfig config;
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::unique_ptr<model::SafetensorsCheckpoint> checkpoint;
  std::unique_ptr<model::Qwen2Weights> weights;
  std::unique_ptr<model::VisionTower> vision;  // vision models with load_vision
  std::unique_ptr<TpGroup> tp_group;           // tp_size > 1
  std::unique_ptr<model::cpu::ThreadPool> pool;
  std::unique_ptr<model::Qwen2Model> model;
  // Rank 0's with tensor parallelism; shared with EngineOptions::
  // kv_cache_placement's provider when it placed it.
  std::shared_ptr<model::KvCache> kv;
  EngineSizing sizing;
  std::vector<int32_t> eos_ids;  // config's eos, then generation_config's
  int32_t image_pad_id = -1;
  int32_t video_pad_id = -1;  // -1: the tokenizer has no <|video_pad|>
};

// InvalidArgument for options out of range or a model that does not fit
// them (tokenizer larger than the vocabulary, tensor parallelism that does
// not split); the loaders' and TpGroup::Start's errors as they come.
[[nodiscard]] absl::StatusOr<std::unique_ptr<EngineModel>> LoadEngineModel(
    const EngineOptions& options);

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_ENGINE_LOAD_H_
