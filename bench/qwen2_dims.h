// Qwen/Qwen2-0.5B's text model dimensions (its config.json), for benchmarks
// on random weights.
//
//   model::TextConfig cfg = Qwen2HalfBDims();
//   cfg.num_hidden_layers = 4;  // per-layer figures at full width
#ifndef MMSERVE_BENCH_QWEN2_DIMS_H_
#define MMSERVE_BENCH_QWEN2_DIMS_H_

#include <string>

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

// Text dimensions by name: qwen2-0.5b, qwen2-vl-2b (its text model),
// qwen3-0.6b and tiny (smoke runs); false for another name.
inline bool NamedTextDims(const std::string& name, model::TextConfig* cfg) {
  if (name == "qwen2-0.5b") {
    *cfg = Qwen2HalfBDims();
    return true;
  }
  *cfg = model::TextConfig();
  cfg->rope_theta = 1000000.0;
  cfg->rms_norm_eps = 1e-6;
  cfg->tie_word_embeddings = true;
  cfg->vocab_size = 151936;
  if (name == "qwen2-vl-2b") {  // Qwen/Qwen2-VL-2B-Instruct text config
    cfg->hidden_size = 1536;
    cfg->intermediate_size = 8960;
    cfg->num_hidden_layers = 28;
    cfg->num_attention_heads = 12;
    cfg->num_key_value_heads = 2;
    cfg->mrope_section = {16, 24, 24};
  } else if (name == "qwen3-0.6b") {  // Qwen/Qwen3-0.6B config.json
    cfg->hidden_size = 1024;
    cfg->intermediate_size = 3072;
    cfg->num_hidden_layers = 28;
    cfg->num_attention_heads = 16;
    cfg->num_key_value_heads = 8;
    cfg->explicit_head_dim = 128;
    cfg->attention_bias = false;
    cfg->qk_norm = true;
  } else if (name == "tiny") {
    cfg->vocab_size = 2048;
    cfg->hidden_size = 128;
    cfg->intermediate_size = 256;
    cfg->num_hidden_layers = 2;
    cfg->num_attention_heads = 4;
    cfg->num_key_value_heads = 2;
  } else {
    return false;
  }
  return true;
}

}  // namespace mmserve

#endif  // MMSERVE_BENCH_QWEN2_DIMS_H_
