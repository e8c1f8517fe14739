// The model directory's JSON configs, parsed and checked: config.json
// (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE, Qwen2, Qwen3, Qwen3-MoE
// text and vision settings), generation_config.json
// (sampling defaults) and preprocessor_config.json (image preprocessing).
//
//   ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig("/models/Qwen2-VL-2B"));
//   int head_dim = cfg.text.head_dim();
//
// Both config.json layouts are read: the older one with text settings at the
// top level, and the newer one with a "text_config" object. A missing or
// inconsistent value is an InvalidArgumentError naming the file and the field
// (e.g. mrope_section that does not sum to head_dim / 2).
#ifndef MMSERVE_MODEL_MODEL_CONFIG_H_
#define MMSERVE_MODEL_MODEL_CONFIG_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mmserve::model {

struct TextConfig {
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  // M-RoPE sections (temporal, height, width) in rotary pairs; they sum to
  // head_dim / 2. Empty for plain 1-D RoPE.
  std::vector<int> mrope_section;
  // Qwen3-VL's layout of the sections: the h and w pairs interleaved with
  // the t pairs (t h w t h w ... t t) instead of one block after another.
  bool mrope_interleaved = false;
  bool tie_word_embeddings = false;
  std::string hidden_act = "silu";
  // config.json's head_dim (Qwen3); 0: hidden_size / num_attention_heads.
  int explicit_head_dim = 0;
  // q/k/v projections carry biases (always in Qwen2; in Qwen3 with
  // attention_bias, which also gives o_proj one).
  bool attention_bias = true;
  // RMSNorm over each head of q and k before the rotary embedding (Qwen3).
  bool qk_norm = false;
  // Mixture of experts (Qwen3-MoE, Qwen3-VL-MoE); num_experts 0: a dense MLP
  // in every layer.
  // A sparse layer routes each token to its num_experts_per_tok most likely
  // experts (softmax over the router's logits), renormalized to sum 1 when
  // norm_topk_prob, each an MLP of width moe_intermediate_size.
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;  // dense layers among sparse ones

  // Whether `layer` routes to experts (transformers' Qwen3MoeDecoderLayer).
  bool moe_layer(int layer) const {
    for (int l : mlp_only_layers) {
      if (l == layer) return false;
    }
    return num_experts > 0 && (layer + 1) % decoder_sparse_step == 0;
  }

  int head_dim() const {
    return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_attention_heads;
  }
};

struct VisionConfig {
  // kQwen2Vl: LayerNorm, fc1/QuickGELU/fc2 MLP, attention inside each image.
  // kQwen25Vl: RMSNorm, gated SiLU MLP (intermediate_size wide), attention
  // inside windows of window_size pixels except in fullatt_block_indexes.
  // kQwen3Vl: LayerNorm, fc1/GELU(tanh)/fc2 MLP (intermediate_size wide),
  // learned position embeddings on a grid of num_position_embeddings, and
  // DeepStack mergers on the outputs of deepstack_visual_indexes' blocks.
  enum class Arch { kQwen2Vl, kQwen25Vl, kQwen3Vl };
  Arch arch = Arch::kQwen2Vl;
  int depth = 0;
  int embed_dim = 0;  // the tower's width (Qwen2.5-VL's vision hidden_size)
  int num_heads = 0;
  int mlp_ratio = 4;
  int in_channels = 3;
  // Width of the merger's output: the language model's hidden size
  // (Qwen2.5-VL's out_hidden_size).
  int hidden_size = 0;
  int intermediate_size = 0;  // kQwen25Vl's MLP width
  int window_size = 0;        // kQwen25Vl, in pixels
  std::vector<int> fullatt_block_indexes;
  int tokens_per_second = 0;                  // kQwen25Vl: video time positions per second
  int num_position_embeddings = 0;            // kQwen3Vl: a square number
  std::vector<int> deepstack_visual_indexes;  // kQwen3Vl: blocks, in order
  int patch_size = 14;
  int spatial_merge_size = 2;
  int temporal_patch_size = 2;
  std::string hidden_act = "quick_gelu";
};

struct SpecialTokenIds {
  int bos = -1;
  std::vector<int> eos;  // any of these ends generation
  int vision_start = -1;
  int vision_end = -1;
  int image_pad = -1;  // "image_token_id": one per image embedding token
  int video_pad = -1;
};

// Defaults from generation_config.json; unset when the file leaves them out.
struct GenerationDefaults {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int> top_k;
  std::optional<float> repetition_penalty;
  std::vector<int> eos_token_ids;
};

// preprocessor_config.json of a Qwen2-VL image processor.
// video_preprocessor_config.json of a Qwen3VLVideoProcessor (Qwen3-VL): frames
// sampled at `fps` unless the request says otherwise, their count clamped to
// [min_frames, max_frames], and a pixel budget (size.shortest_edge /
// longest_edge) over all sampled frames together (model/qwen3vl_video.h).
struct Qwen3VideoSettings {
  double fps = 2.0;
  int64_t min_frames = 4;
  int64_t max_frames = 768;
  int64_t min_pixels = 128 * 32 * 32;
  int64_t max_pixels = 768 * 32 * 32;
};

struct PreprocessorConfig {
  int64_t min_pixels = 56 * 56;
  int64_t max_pixels = 28 * 28 * 1280;
  int patch_size = 14;
  int merge_size = 2;
  int temporal_patch_size = 2;
  std::array<float, 3> image_mean = {0.48145466f, 0.4578275f, 0.40821073f};
  std::array<float, 3> image_std = {0.26862954f, 0.26130258f, 0.27577711f};
  double rescale_factor = 1.0 / 255.0;
  // Set when the checkpoint's video processor is Qwen3-VL's: videos are
  // sampled and sized by its rules, their prompt shows timestamps.
  std::optional<Qwen3VideoSettings> qwen3_video;
};

struct ModelConfig {
  std::string architecture;  // e.g. "Qwen2VLForConditionalGeneration"
  std::string model_type;    // e.g. "qwen2_vl"
  std::string torch_dtype;   // dtype the weights were saved in ("bfloat16", ...)
  TextConfig text;
  std::optional<VisionConfig> vision;  // absent for text-only Qwen2 models
  SpecialTokenIds tokens;
  GenerationDefaults generation;
  std::optional<PreprocessorConfig> preprocessor;

  // The M-RoPE time step of a video's temporal patches (MediaGrid::time_step)
  // when the request sampled it at `fps` (unset: the processor's default
  // of 2). 1 for Qwen2-VL. Qwen2.5-VL follows transformers 4.57's
  // get_rope_index: seconds per temporal patch (temporal_patch_size / fps,
  // as float32) truncated to an integer, times tokens_per_second (vLLM keeps
  // the fraction; at the default 2 fps both give tokens_per_second).
  int VideoTimeStep(std::optional<double> fps) const;

  // Qwen3-VL's DeepStack features per image token: one per
  // deepstack_visual_indexes entry (0 for the other families).
  int DeepstackLevels() const {
    return vision ? static_cast<int>(vision->deepstack_visual_indexes.size()) : 0;
  }
  // Floats per image token from the encoder to the language model: the main
  // embedding, then each DeepStack feature (text.hidden_size each).
  int EmbeddingRowWidth() const { return text.hidden_size * (1 + DeepstackLevels()); }
};

// Parses config.json text. `origin` names it in errors.
[[nodiscard]] absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json,
                                                           const std::string& origin);
[[nodiscard]] absl::StatusOr<GenerationDefaults> ParseGenerationConfig(const std::string& json,
                                                                       const std::string& origin);
[[nodiscard]] absl::StatusOr<PreprocessorConfig> ParsePreprocessorConfig(const std::string& json,
                                                                         const std::string& origin);

// video_preprocessor_config.json: its settings when video_processor_type is
// Qwen3VLVideoProcessor, nullopt for another processor. InvalidArgument
// naming `origin` and the field, also for patch settings (sizes, mean, std)
// that differ from `image`'s or do_sample_frames false.
[[nodiscard]] absl::StatusOr<std::optional<Qwen3VideoSettings>> ParseQwen3VideoSettings(
    const std::string& json, const std::string& origin, const PreprocessorConfig& image);

// Reads config.json (required), generation_config.json,
// preprocessor_config.json and video_preprocessor_config.json (optional)
// from a model directory.
[[nodiscard]] absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_MODEL_CONFIG_H_
