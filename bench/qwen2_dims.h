// Qwen/Qwen2-0.5B's text model dimensions (its config.json), for benchmarks
// on random weights.
//
//   model::TextConfig cfg = Qwen2HalfBDims();
//   cfg.num_hidden_layers = 4;  // per-layer figures at full width
#ifndef MMSERVE_BENCH_QWEN2_DIMS_H_
#define MMSERVE_BENCH_QWEN2_DIMS_H_

#include "model/model_config.h"

namespace mmserve {

inline model::TextConfig Qwen2HalfBDims() {
  model::TextConfig cfg;
  cfg.rope_theta = 1000000.0;
  cfg.rms_norm_eps = 1e-6;
  cfg.tie_word_embeddings = true;
  cfg.vocab_size = 151936;
  cfg.hidden_size = 896;
  cfg.intermediate_size = 4864;
  cfg.num_hidden_layers = 24;
  cfg.num_attention_heads = 14;
  cfg.num_key_value_heads = 2;
  return cfg;
}

}  // namespace mmserve

#endif  // MMSERVE_BENCH_QWEN2_DIMS_H_
