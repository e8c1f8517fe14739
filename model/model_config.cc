#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file.h"
#include "common/status_macros.h"

namespace mmserve::model {
namespace {

using nlohmann::json;

// Reads typed fields from one JSON object, naming `origin` and the field in
// every error.
class Fields {
 public:
  Fields(const json& obj, std::string origin) : obj_(obj), origin_(std::move(origin)) {}

  absl::Status Int(const char* key, int* out, bool required = true) const {
    return Get(key, required, [&](const json& v) {
      if (!v.is_number_integer()) return false;
      *out = v.get<int>();
      return true;
    });
  }
  absl::Status Int64(const char* key, int64_t* out) const {
    return Get(key, false, [&](const json& v) {
      if (!v.is_number_integer()) return false;
      *out = v.get<int64_t>();
      return true;
    });
  }
  absl::Status Double(const char* key, double* out, bool required = false) const {
    return Get(key, required, [&](const json& v) {
      if (!v.is_number()) return false;
      *out = v.get<double>();
      return true;
    });
  }
  absl::Status Bool(const char* key, bool* out) const {
    return Get(key, false, [&](const json& v) {
      if (!v.is_boolean()) return false;
      *out = v.get<bool>();
      return true;
    });
  }
  absl::Status String(const char* key, std::string* out) const {
    return Get(key, false, [&](const json& v) {
      if (!v.is_string()) return false;
      *out = v.get<std::string>();
      return true;
    });
  }
  // An int or a list of ints (eos_token_id is either).
  absl::Status IntList(const char* key, std::vector<int>* out) const {
    return Get(key, false, [&](const json& v) {
      out->clear();
      if (v.is_number_integer()) {
        out->push_back(v.get<int>());
        return true;
      }
      if (!v.is_array()) return false;
      for (const json& e : v) {
        if (!e.is_number_integer()) return false;
        out->push_back(e.get<int>());
      }
      return true;
    });
  }

  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(origin_, ": ", what));
  }
  const json& obj() const { return obj_; }

 private:
  template <typename F>
  absl::Status Get(const char* key, bool required, F&& read) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) {
      return required ? Error(absl::StrCat("missing \"", key, "\"")) : absl::OkStatus();
    }
    if (!read(*it)) return Error(absl::StrCat("\"", key, "\" has the wrong type: ", it->dump()));
    return absl::OkStatus();
  }

  const json& obj_;
  std::string origin_;
};

absl::StatusOr<json> ParseObject(const std::string& text, const std::string& origin) {
  json obj = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (obj.is_discarded() || !obj.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": not a JSON object"));
  }
  return obj;
}

// Qwen3's attention: an explicit head_dim, optional q/k/v biases and a
// per-head RMSNorm of q and k. Sliding-window attention is refused for every
// family (no kernel implements it).
absl::Status ParseAttentionVariant(const Fields& f, const std::string& model_type, TextConfig* t) {
  if (model_type == "qwen3" || model_type == "qwen3_moe" || model_type == "qwen3_vl" ||
      model_type == "qwen3_vl_moe") {
    RETURN_IF_ERROR(f.Int("head_dim", &t->explicit_head_dim, false));
    t->attention_bias = false;
    RETURN_IF_ERROR(f.Bool("attention_bias", &t->attention_bias));
    t->qk_norm = true;
  }
  bool sliding = false;
  RETURN_IF_ERROR(f.Bool("use_sliding_window", &sliding));
  if (sliding) return f.Error("use_sliding_window true is not supported (full attention only)");
  if (t->explicit_head_dim < 0) return f.Error("head_dim must be positive");
  return absl::OkStatus();
}

// Qwen3-MoE's and Qwen3-VL-MoE's experts: counts, widths and which layers
// are sparse. Qwen3-VL-MoE always renormalizes the top-k weights:
// transformers' Qwen3VLMoeTextSparseMoeBlock ignores norm_topk_prob.
absl::Status ParseExperts(const Fields& f, const std::string& model_type, TextConfig* t) {
  RETURN_IF_ERROR(f.Int("num_experts", &t->num_experts));
  RETURN_IF_ERROR(f.Int("num_experts_per_tok", &t->num_experts_per_tok));
  RETURN_IF_ERROR(f.Int("moe_intermediate_size", &t->moe_intermediate_size));
  RETURN_IF_ERROR(f.Bool("norm_topk_prob", &t->norm_topk_prob));
  if (model_type == "qwen3_vl_moe") t->norm_topk_prob = true;
  RETURN_IF_ERROR(f.Int("decoder_sparse_step", &t->decoder_sparse_step, false));
  RETURN_IF_ERROR(f.IntList("mlp_only_layers", &t->mlp_only_layers));
  if (t->num_experts <= 0 || t->moe_intermediate_size <= 0) {
    return f.Error("num_experts and moe_intermediate_size must be positive");
  }
  if (t->num_experts_per_tok < 1 || t->num_experts_per_tok > t->num_experts) {
    return f.Error(absl::StrCat("num_experts_per_tok ", t->num_experts_per_tok,
                                " is outside [1, num_experts ", t->num_experts, "]"));
  }
  if (t->decoder_sparse_step < 1) return f.Error("decoder_sparse_step must be >= 1");
  return absl::OkStatus();
}

// transformers' apply_interleaved_mrope gives the h pairs 1, 4, 7, ... below
// 3 x mrope_section[1] and the w pairs 2, 5, 8, ... below 3 x
// mrope_section[2]; both runs must fit in head_dim / 2 for every section to
// get the pairs it names.
absl::Status CheckInterleavedSections(const Fields& f, const TextConfig& t) {
  const int half = t.head_dim() / 2;
  if (t.mrope_section.size() != 3 || 3 * t.mrope_section[1] - 2 >= half ||
      3 * t.mrope_section[2] - 1 >= half) {
    return f.Error(absl::StrCat("rope_scaling.mrope_interleaved needs 3 sections whose h and w ",
                                "pairs fit in head_dim / 2 = ", half));
  }
  return absl::OkStatus();
}

absl::Status ParseText(const Fields& f, const std::string& model_type, TextConfig* t) {
  RETURN_IF_ERROR(f.Int("vocab_size", &t->vocab_size));
  RETURN_IF_ERROR(f.Int("hidden_size", &t->hidden_size));
  RETURN_IF_ERROR(f.Int("intermediate_size", &t->intermediate_size));
  RETURN_IF_ERROR(f.Int("num_hidden_layers", &t->num_hidden_layers));
  RETURN_IF_ERROR(f.Int("num_attention_heads", &t->num_attention_heads));
  t->num_key_value_heads = t->num_attention_heads;
  RETURN_IF_ERROR(f.Int("num_key_value_heads", &t->num_key_value_heads, false));
  RETURN_IF_ERROR(f.Int("max_position_embeddings", &t->max_position_embeddings, false));
  RETURN_IF_ERROR(f.Double("rms_norm_eps", &t->rms_norm_eps));
  RETURN_IF_ERROR(f.Double("rope_theta", &t->rope_theta));
  RETURN_IF_ERROR(f.Bool("tie_word_embeddings", &t->tie_word_embeddings));
  RETURN_IF_ERROR(f.String("hidden_act", &t->hidden_act));
  RETURN_IF_ERROR(ParseAttentionVariant(f, model_type, t));
  if (model_type == "qwen3_moe" || model_type == "qwen3_vl_moe") {
    RETURN_IF_ERROR(ParseExperts(f, model_type, t));
  }
  auto rs = f.obj().find("rope_scaling");
  if (rs != f.obj().end() && rs->is_object()) {
    Fields scaling(*rs, "rope_scaling");
    std::string type;
    RETURN_IF_ERROR(scaling.String("type", &type));
    if (type.empty()) RETURN_IF_ERROR(scaling.String("rope_type", &type));
    RETURN_IF_ERROR(scaling.IntList("mrope_section", &t->mrope_section));
    RETURN_IF_ERROR(scaling.Bool("mrope_interleaved", &t->mrope_interleaved));
    if (type != "mrope" && type != "default" && !type.empty()) {
      return f.Error(absl::StrCat("rope_scaling type \"", type, "\" is not supported"));
    }
  }
  // Consistency: the shapes every kernel relies on.
  if (t->vocab_size <= 0 || t->hidden_size <= 0 || t->num_hidden_layers <= 0 ||
      t->intermediate_size <= 0 || t->num_attention_heads <= 0 || t->num_key_value_heads <= 0) {
    return f.Error("sizes and counts must be positive");
  }
  if (t->explicit_head_dim == 0 && t->hidden_size % t->num_attention_heads != 0) {
    return f.Error(absl::StrCat("hidden_size ", t->hidden_size,
                                " is not a multiple of num_attention_heads ",
                                t->num_attention_heads));
  }
  if (t->num_attention_heads % t->num_key_value_heads != 0) {
    return f.Error(absl::StrCat("num_attention_heads ", t->num_attention_heads,
                                " is not a multiple of num_key_value_heads ",
                                t->num_key_value_heads));
  }
  if (t->head_dim() % 2 != 0) return f.Error("head_dim must be even for rotary embeddings");
  if (!t->mrope_section.empty()) {
    int64_t sum = 0;  // wide enough for three ints
    for (int s : t->mrope_section) {
      if (s < 0) return f.Error(absl::StrCat("mrope_section has a negative section ", s));
      sum += s;
    }
    if (t->mrope_section.size() != 3) {
      return f.Error(absl::StrCat("rope_scaling.mrope_section must have 3 sections, got ",
                                  t->mrope_section.size()));
    }
    if (sum != t->head_dim() / 2 && t->explicit_head_dim > 0) {
      return f.Error(absl::StrCat("rope_scaling.mrope_section sums to ", sum, ", not head_dim ",
                                  t->head_dim(), " / 2"));
    }
    if (sum != t->head_dim() / 2) {
      // head_dim is not in config.json: it is hidden_size / num_attention_heads,
      // so a wrong hidden_size shows up here first. Name all three.
      return f.Error(absl::StrCat(
          "hidden_size ", t->hidden_size, " / num_attention_heads ", t->num_attention_heads,
          " gives head_dim ", t->head_dim(), ", but rope_scaling.mrope_section sums to ", sum,
          " (head_dim ", 2 * sum, "): check hidden_size and num_attention_heads",
          t->hidden_size != 2 * sum * t->num_attention_heads
              ? absl::StrCat(" (hidden_size ", 2 * sum * t->num_attention_heads,
                             " would fit mrope_section)")
              : std::string()));
    }
  }
  if (t->mrope_interleaved) RETURN_IF_ERROR(CheckInterleavedSections(f, *t));
  if (t->hidden_act != "silu") {
    return f.Error(absl::StrCat("hidden_act \"", t->hidden_act, "\" is not supported (silu)"));
  }
  return absl::OkStatus();
}

// Qwen2.5-VL's vision_config: hidden_size is the tower's width and
// out_hidden_size the merger's; windows and full-attention blocks.
absl::Status ParseQwen25Vision(const Fields& f, VisionConfig* v) {
  v->arch = VisionConfig::Arch::kQwen25Vl;
  v->hidden_act = "silu";
  RETURN_IF_ERROR(f.Int("hidden_size", &v->embed_dim));
  RETURN_IF_ERROR(f.Int("out_hidden_size", &v->hidden_size));
  RETURN_IF_ERROR(f.Int("intermediate_size", &v->intermediate_size));
  RETURN_IF_ERROR(f.Int("window_size", &v->window_size));
  RETURN_IF_ERROR(f.IntList("fullatt_block_indexes", &v->fullatt_block_indexes));
  RETURN_IF_ERROR(f.Int("tokens_per_second", &v->tokens_per_second, false));
  if (v->intermediate_size <= 0) return f.Error("intermediate_size must be positive");
  const int unit = v->spatial_merge_size * v->patch_size;
  if (v->window_size <= 0 || unit <= 0 || v->window_size % unit != 0) {
    return f.Error(absl::StrCat("window_size ", v->window_size,
                                " must be a positive multiple of spatial_merge_size x patch_size ",
                                unit));
  }
  return absl::OkStatus();
}

// Qwen3-VL's vision_config (transformers' Qwen3VLVisionConfig): hidden_size
// is the tower's width and out_hidden_size the mergers'; a learned position
// grid and the DeepStack blocks.
absl::Status ParseQwen3Vision(const Fields& f, VisionConfig* v) {
  v->arch = VisionConfig::Arch::kQwen3Vl;
  v->patch_size = 16;
  v->hidden_act = "gelu_pytorch_tanh";
  RETURN_IF_ERROR(f.Int("patch_size", &v->patch_size, false));
  RETURN_IF_ERROR(f.Int("hidden_size", &v->embed_dim));
  RETURN_IF_ERROR(f.Int("out_hidden_size", &v->hidden_size));
  RETURN_IF_ERROR(f.Int("intermediate_size", &v->intermediate_size));
  RETURN_IF_ERROR(f.Int("num_position_embeddings", &v->num_position_embeddings));
  RETURN_IF_ERROR(f.IntList("deepstack_visual_indexes", &v->deepstack_visual_indexes));
  if (v->intermediate_size <= 0) return f.Error("intermediate_size must be positive");
  const int side = static_cast<int>(std::lround(std::sqrt(v->num_position_embeddings)));
  if (v->num_position_embeddings <= 0 || side * side != v->num_position_embeddings) {
    return f.Error(absl::StrCat("num_position_embeddings ", v->num_position_embeddings,
                                " must be a positive square (a grid of position embeddings)"));
  }
  int previous = -1;
  for (int i : v->deepstack_visual_indexes) {
    if (i < 0 || i >= v->depth) {
      return f.Error(absl::StrCat("deepstack_visual_indexes has block ", i, " outside [0, depth ",
                                  v->depth, ")"));
    }
    if (i <= previous) return f.Error("deepstack_visual_indexes must be increasing");
    previous = i;
  }
  return absl::OkStatus();
}

absl::Status ParseVision(const Fields& f, const std::string& model_type, VisionConfig* v) {
  RETURN_IF_ERROR(f.Int("depth", &v->depth));
  RETURN_IF_ERROR(f.Int("num_heads", &v->num_heads));
  RETURN_IF_ERROR(f.Int("in_chans", &v->in_channels, false));
  RETURN_IF_ERROR(f.Int("in_channels", &v->in_channels, false));
  RETURN_IF_ERROR(f.Int("patch_size", &v->patch_size, false));
  RETURN_IF_ERROR(f.Int("spatial_merge_size", &v->spatial_merge_size, false));
  if (model_type == "qwen2_5_vl") {
    RETURN_IF_ERROR(ParseQwen25Vision(f, v));
  } else if (model_type == "qwen3_vl" || model_type == "qwen3_vl_moe") {
    RETURN_IF_ERROR(ParseQwen3Vision(f, v));
  } else {
    RETURN_IF_ERROR(f.Int("embed_dim", &v->embed_dim));
    RETURN_IF_ERROR(f.Int("mlp_ratio", &v->mlp_ratio, false));
    RETURN_IF_ERROR(f.Int("hidden_size", &v->hidden_size));
  }
  RETURN_IF_ERROR(f.Int("temporal_patch_size", &v->temporal_patch_size, false));
  RETURN_IF_ERROR(f.String("hidden_act", &v->hidden_act));
  if (v->arch == VisionConfig::Arch::kQwen3Vl && v->hidden_act != "gelu_pytorch_tanh") {
    return f.Error(
        absl::StrCat("hidden_act \"", v->hidden_act, "\" is not supported (gelu_pytorch_tanh)"));
  }
  if (v->depth <= 0 || v->embed_dim <= 0 || v->num_heads <= 0 || v->patch_size <= 0 ||
      v->spatial_merge_size <= 0 || v->temporal_patch_size <= 0 ||
      v->embed_dim % v->num_heads != 0) {
    return f.Error("vision_config: sizes must be positive and embed_dim divisible by num_heads");
  }
  return absl::OkStatus();
}

absl::Status ParseTokens(const Fields& f, SpecialTokenIds* t) {
  RETURN_IF_ERROR(f.Int("bos_token_id", &t->bos, false));
  RETURN_IF_ERROR(f.IntList("eos_token_id", &t->eos));
  RETURN_IF_ERROR(f.Int("vision_start_token_id", &t->vision_start, false));
  RETURN_IF_ERROR(f.Int("vision_end_token_id", &t->vision_end, false));
  RETURN_IF_ERROR(f.Int("image_token_id", &t->image_pad, false));
  RETURN_IF_ERROR(f.Int("video_token_id", &t->video_pad, false));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& text, const std::string& origin) {
  ASSIGN_OR_RETURN(json root, ParseObject(text, origin));
  Fields top(root, origin);
  ModelConfig cfg;
  auto arch = root.find("architectures");
  if (arch != root.end() && arch->is_array() && !arch->empty() && (*arch)[0].is_string()) {
    cfg.architecture = (*arch)[0].get<std::string>();
  }
  RETURN_IF_ERROR(top.String("model_type", &cfg.model_type));
  RETURN_IF_ERROR(top.String("torch_dtype", &cfg.torch_dtype));
  static constexpr const char* kFamilies[] = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe",
                                              "qwen2",    "qwen3",      "qwen3_moe"};
  if (std::find(std::begin(kFamilies), std::end(kFamilies), cfg.model_type) ==
      std::end(kFamilies)) {
    return top.Error(absl::StrCat("model_type \"", cfg.model_type, "\" is not supported (",
                                  absl::StrJoin(kFamilies, ", "), ")"));
  }
  // Newer transformers nest the text settings in "text_config"; older ones
  // keep them at the top level. Token ids may sit in either place.
  auto text_it = root.find("text_config");
  const json& text_obj = (text_it != root.end() && text_it->is_object()) ? *text_it : root;
  RETURN_IF_ERROR(ParseText(Fields(text_obj, origin), cfg.model_type, &cfg.text));
  RETURN_IF_ERROR(ParseTokens(Fields(text_obj, origin), &cfg.tokens));
  if (&text_obj != &root) RETURN_IF_ERROR(ParseTokens(top, &cfg.tokens));
  if (cfg.torch_dtype.empty())
    RETURN_IF_ERROR(Fields(text_obj, origin).String("torch_dtype", &cfg.torch_dtype));
  // transformers 4.56 and later write "dtype" instead.
  if (cfg.torch_dtype.empty()) RETURN_IF_ERROR(top.String("dtype", &cfg.torch_dtype));
  if (cfg.torch_dtype.empty())
    RETURN_IF_ERROR(Fields(text_obj, origin).String("dtype", &cfg.torch_dtype));

  auto vis = root.find("vision_config");
  if (vis != root.end() && vis->is_object()) {
    VisionConfig v;
    RETURN_IF_ERROR(ParseVision(Fields(*vis, origin + " vision_config"), cfg.model_type, &v));
    if (v.hidden_size != cfg.text.hidden_size) {
      return top.Error(absl::StrCat("vision_config.hidden_size ", v.hidden_size,
                                    " differs from the language hidden_size ",
                                    cfg.text.hidden_size));
    }
    cfg.vision = v;
  } else if (cfg.model_type == "qwen2_vl" || cfg.model_type == "qwen2_5_vl" ||
             cfg.model_type == "qwen3_vl" || cfg.model_type == "qwen3_vl_moe") {
    return top.Error(cfg.model_type + " config has no \"vision_config\"");
  }
  if (cfg.vision && cfg.text.mrope_section.empty()) {
    return top.Error("a vision model needs rope_scaling.mrope_section");
  }
  if (cfg.vision && cfg.vision->deepstack_visual_indexes.size() >
                        static_cast<size_t>(cfg.text.num_hidden_layers)) {
    return top.Error(absl::StrCat(
        "vision_config.deepstack_visual_indexes has ", cfg.vision->deepstack_visual_indexes.size(),
        " blocks, more than the language model's ", cfg.text.num_hidden_layers, " layers"));
  }
  return cfg;
}

absl::StatusOr<GenerationDefaults> ParseGenerationConfig(const std::string& text,
                                                         const std::string& origin) {
  ASSIGN_OR_RETURN(json root, ParseObject(text, origin));
  Fields f(root, origin);
  GenerationDefaults g;
  double d;
  int i;
  if (root.contains("temperature")) {
    RETURN_IF_ERROR(f.Double("temperature", &d));
    g.temperature = static_cast<float>(d);
  }
  if (root.contains("top_p")) {
    RETURN_IF_ERROR(f.Double("top_p", &d));
    g.top_p = static_cast<float>(d);
  }
  if (root.contains("top_k")) {
    RETURN_IF_ERROR(f.Int("top_k", &i));
    g.top_k = i;
  }
  if (root.contains("repetition_penalty")) {
    RETURN_IF_ERROR(f.Double("repetition_penalty", &d));
    g.repetition_penalty = static_cast<float>(d);
  }
  RETURN_IF_ERROR(f.IntList("eos_token_id", &g.eos_token_ids));
  return g;
}

absl::StatusOr<PreprocessorConfig> ParsePreprocessorConfig(const std::string& text,
                                                           const std::string& origin) {
  ASSIGN_OR_RETURN(json root, ParseObject(text, origin));
  Fields f(root, origin);
  PreprocessorConfig p;
  RETURN_IF_ERROR(f.Int64("min_pixels", &p.min_pixels));
  RETURN_IF_ERROR(f.Int64("max_pixels", &p.max_pixels));
  // Newer processors spell the bounds as size.shortest_edge / longest_edge.
  auto size = root.find("size");
  if (size != root.end() && size->is_object()) {
    Fields s(*size, origin + " size");
    RETURN_IF_ERROR(s.Int64("shortest_edge", &p.min_pixels));
    RETURN_IF_ERROR(s.Int64("longest_edge", &p.max_pixels));
    RETURN_IF_ERROR(s.Int64("min_pixels", &p.min_pixels));
    RETURN_IF_ERROR(s.Int64("max_pixels", &p.max_pixels));
  }
  RETURN_IF_ERROR(f.Int("patch_size", &p.patch_size, false));
  RETURN_IF_ERROR(f.Int("merge_size", &p.merge_size, false));
  RETURN_IF_ERROR(f.Int("temporal_patch_size", &p.temporal_patch_size, false));
  RETURN_IF_ERROR(f.Double("rescale_factor", &p.rescale_factor));
  for (const char* key : {"image_mean", "image_std"}) {
    auto it = root.find(key);
    if (it == root.end()) continue;
    if (!it->is_array() || it->size() != 3) return f.Error(absl::StrCat(key, " must be 3 numbers"));
    auto& dst = std::string(key) == "image_mean" ? p.image_mean : p.image_std;
    for (int c = 0; c < 3; ++c) {
      if (!(*it)[c].is_number()) return f.Error(absl::StrCat(key, " must be 3 numbers"));
      dst[c] = (*it)[c].get<float>();
    }
  }
  if (p.min_pixels <= 0 || p.max_pixels < p.min_pixels || p.patch_size <= 0 || p.merge_size <= 0 ||
      p.temporal_patch_size <= 0) {
    return f.Error("need 0 < min_pixels <= max_pixels and positive patch/merge/temporal sizes");
  }
  for (float s : p.image_std) {
    if (!(s > 0)) return f.Error("image_std must be positive");
  }
  return p;
}

absl::StatusOr<std::optional<Qwen3VideoSettings>> ParseQwen3VideoSettings(
    const std::string& text, const std::string& origin, const PreprocessorConfig& image) {
  ASSIGN_OR_RETURN(json root, ParseObject(text, origin));
  const auto type = root.find("video_processor_type");
  if (type == root.end() || *type != "Qwen3VLVideoProcessor") return std::nullopt;
  Fields f(root, origin);
  if (const auto s = root.find("do_sample_frames"); s != root.end() && *s == false) {
    return f.Error("do_sample_frames false is not supported");
  }
  ASSIGN_OR_RETURN(const PreprocessorConfig sizes, ParsePreprocessorConfig(text, origin));
  const auto has = [&](const char* key, const char* size_key) {
    const auto size = root.find("size");
    return root.contains(key) || (size != root.end() && size->is_object() &&
                                  (size->contains(size_key) || size->contains(key)));
  };
  // Absent bounds keep Qwen3VLVideoProcessor's defaults, not the image's.
  Qwen3VideoSettings v;
  if (has("min_pixels", "shortest_edge")) v.min_pixels = sizes.min_pixels;
  if (has("max_pixels", "longest_edge")) v.max_pixels = sizes.max_pixels;
  // The patches are the image processor's (the tower takes both alike).
  const bool differs = (root.contains("patch_size") && sizes.patch_size != image.patch_size) ||
                       (root.contains("merge_size") && sizes.merge_size != image.merge_size) ||
                       (root.contains("temporal_patch_size") &&
                        sizes.temporal_patch_size != image.temporal_patch_size) ||
                       (root.contains("image_mean") && sizes.image_mean != image.image_mean) ||
                       (root.contains("image_std") && sizes.image_std != image.image_std);
  if (differs) {
    return f.Error("patch, merge or temporal size, mean or std differ from the image processor's");
  }
  if (const auto fps = root.find("fps"); fps != root.end() && !fps->is_null()) {
    if (!fps->is_number() || !(fps->get<double>() > 0)) return f.Error("fps must be positive");
    v.fps = fps->get<double>();
  }
  RETURN_IF_ERROR(f.Int64("min_frames", &v.min_frames));
  RETURN_IF_ERROR(f.Int64("max_frames", &v.max_frames));
  if (v.min_frames < 1 || v.max_frames < v.min_frames) {
    return f.Error("need 1 <= min_frames <= max_frames");
  }
  return v;
}

int ModelConfig::VideoTimeStep(std::optional<double> fps) const {
  if (!vision || vision->arch != VisionConfig::Arch::kQwen25Vl) return 1;
  const int patch = preprocessor ? preprocessor->temporal_patch_size : vision->temporal_patch_size;
  // Bounded so that positions stay far inside int32 for any positive fps.
  const float seconds = std::min(static_cast<float>(patch / fps.value_or(2.0)), 65536.0f);
  return static_cast<int>(seconds) * vision->tokens_per_second;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(config_path));
  ASSIGN_OR_RETURN(ModelConfig cfg, ParseModelConfig(text, config_path));
  const std::string gen_path = dir + "/generation_config.json";
  if (auto gen = ReadFileToString(gen_path); gen.ok()) {
    ASSIGN_OR_RETURN(cfg.generation, ParseGenerationConfig(*gen, gen_path));
  }
  const std::string pre_path = dir + "/preprocessor_config.json";
  if (auto pre = ReadFileToString(pre_path); pre.ok()) {
    ASSIGN_OR_RETURN(cfg.preprocessor, ParsePreprocessorConfig(*pre, pre_path));
    const std::string video_path = dir + "/video_preprocessor_config.json";
    if (auto video = ReadFileToString(video_path); video.ok()) {
      ASSIGN_OR_RETURN(cfg.preprocessor->qwen3_video,
                       ParseQwen3VideoSettings(*video, video_path, *cfg.preprocessor));
    }
  }
  if (cfg.tokens.eos.empty()) cfg.tokens.eos = cfg.generation.eos_token_ids;
  return cfg;
}

}  // namespace mmserve::model
