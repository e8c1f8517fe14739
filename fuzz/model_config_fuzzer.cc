// Hostile config.json, generation_config.json and preprocessor_config.json
// text (first byte picks which). Properties: everything rejected is
// InvalidArgument; everything accepted satisfies the invariants the kernels
// and the image processor rely on (positive sizes, heads dividing the hidden
// size, key/value heads dividing the heads, an even head_dim, M-RoPE sections
// summing to head_dim / 2, 0 < min_pixels <= max_pixels, positive patch,
// merge and temporal patch sizes, positive std).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_check.h"
#include "model/model_config.h"

namespace mmserve::model {
namespace {

void CheckModel(const std::string& text) {
  absl::StatusOr<ModelConfig> cfg = ParseModelConfig(text, "config.json");
  if (!cfg.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(cfg.status())) << cfg.status();
    return;
  }
  const TextConfig& t = cfg->text;
  FUZZ_CHECK(t.vocab_size > 0 && t.hidden_size > 0 && t.intermediate_size > 0 &&
             t.num_hidden_layers > 0 && t.num_attention_heads > 0 && t.num_key_value_heads > 0);
  FUZZ_CHECK(t.hidden_size % t.num_attention_heads == 0);
  FUZZ_CHECK(t.num_attention_heads % t.num_key_value_heads == 0);
  FUZZ_CHECK(t.head_dim() > 0 && t.head_dim() % 2 == 0) << t.head_dim();
  if (!t.mrope_section.empty()) {
    FUZZ_CHECK(t.mrope_section.size() == 3);
    int64_t sum = 0;
    for (int s : t.mrope_section) {
      FUZZ_CHECK(s >= 0) << "negative M-RoPE section " << s;
      sum += s;
    }
    FUZZ_CHECK(sum == t.head_dim() / 2) << sum;
  }
  if (cfg->vision) {
    const VisionConfig& v = *cfg->vision;
    FUZZ_CHECK(v.depth > 0 && v.embed_dim > 0 && v.num_heads > 0 && v.patch_size > 0 &&
               v.spatial_merge_size > 0 && v.temporal_patch_size > 0);
    FUZZ_CHECK(v.embed_dim % v.num_heads == 0);
  }
}

void CheckGeneration(const std::string& text) {
  absl::StatusOr<GenerationDefaults> g = ParseGenerationConfig(text, "generation_config.json");
  if (!g.ok()) FUZZ_CHECK(absl::IsInvalidArgument(g.status())) << g.status();
}

void CheckPreprocessor(const std::string& text) {
  absl::StatusOr<PreprocessorConfig> p = ParsePreprocessorConfig(text, "preprocessor_config.json");
  if (!p.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(p.status())) << p.status();
    return;
  }
  FUZZ_CHECK(p->min_pixels > 0 && p->min_pixels <= p->max_pixels);
  FUZZ_CHECK(p->patch_size > 0 && p->merge_size > 0);
  FUZZ_CHECK(p->temporal_patch_size > 0) << p->temporal_patch_size;
  for (float s : p->image_std) FUZZ_CHECK(s > 0) << s;
}

}  // namespace
}  // namespace mmserve::model

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0:
      mmserve::model::CheckModel(text);
      break;
    case 1:
      mmserve::model::CheckGeneration(text);
      break;
    default:
      mmserve::model::CheckPreprocessor(text);
      break;
  }
  return 0;
}
