#include "model/model_config.h"

#include <catch2/catch.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace mmserve::model {
namespace {

using nlohmann::json;

// The shape of Qwen2-VL-2B-Instruct's config.json (older flat layout).
json Qwen2Vl2bConfig() {
  return json::parse(R"({
    "architectures": ["Qwen2VLForConditionalGeneration"],
    "bos_token_id": 151643, "eos_token_id": 151645,
    "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656,
    "hidden_act": "silu", "hidden_size": 1536, "intermediate_size": 8960,
    "max_position_embeddings": 32768, "model_type": "qwen2_vl",
    "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "vocab_size": 151936,
    "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16,
      "in_chans": 3, "hidden_size": 1536, "patch_size": 14, "spatial_merge_size": 2,
      "temporal_patch_size": 2},
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}
  })");
}

TEST_CASE("a Qwen2-VL-2B config.json parses with every field", "[config]") {
  auto cfg = ParseModelConfig(Qwen2Vl2bConfig().dump(), "config.json");
  REQUIRE(cfg.ok());
  CHECK(cfg->architecture == "Qwen2VLForConditionalGeneration");
  CHECK(cfg->torch_dtype == "bfloat16");
  CHECK(cfg->text.head_dim() == 128);
  CHECK(cfg->text.num_key_value_heads == 2);
  CHECK(cfg->text.mrope_section == std::vector<int>{16, 24, 24});
  CHECK(cfg->text.rope_theta == 1000000.0);
  CHECK(cfg->text.tie_word_embeddings);
  REQUIRE(cfg->vision.has_value());
  CHECK(cfg->vision->embed_dim == 1280);
  CHECK(cfg->vision->hidden_act == "quick_gelu");
  CHECK(cfg->tokens.image_pad == 151655);
  CHECK(cfg->tokens.eos == std::vector<int>{151645});
}

TEST_CASE("the newer text_config layout reads the same values", "[config]") {
  json flat = Qwen2Vl2bConfig();
  json nested = {{"model_type", "qwen2_vl"},
                 {"architectures", flat["architectures"]},
                 {"vision_config", flat["vision_config"]},
                 {"image_token_id", 151655},
                 {"text_config", flat}};
  nested["text_config"].erase("vision_config");
  nested["text_config"].erase("image_token_id");
  auto cfg = ParseModelConfig(nested.dump(), "config.json");
  REQUIRE(cfg.ok());
  CHECK(cfg->text.hidden_size == 1536);
  CHECK(cfg->text.mrope_section == std::vector<int>{16, 24, 24});
  CHECK(cfg->tokens.image_pad == 151655);
  CHECK(cfg->torch_dtype == "bfloat16");
}

// The shape of Qwen3-0.6B's config.json (transformers 4.57).
json Qwen3Config() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
    "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16,
    "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936
  })");
}

TEST_CASE("a Qwen3 config: head_dim from the file, q/k norm, biases only with attention_bias",
          "[config]") {
  auto cfg = ParseModelConfig(Qwen3Config().dump(), "q3/config.json");
  INFO(cfg.status().ToString());
  REQUIRE(cfg.ok());
  CHECK(cfg->model_type == "qwen3");
  CHECK(cfg->text.head_dim() == 128);  // not 1024 / 16 = 64
  CHECK(cfg->text.qk_norm);
  CHECK_FALSE(cfg->text.attention_bias);
  CHECK_FALSE(cfg->vision.has_value());
  json with_bias = Qwen3Config();
  with_bias["attention_bias"] = true;
  CHECK(ParseModelConfig(with_bias.dump(), "q3")->text.attention_bias);
  // Qwen2 always has q/k/v biases and no q/k norm.
  auto q2 = ParseModelConfig(Qwen2Vl2bConfig().dump(), "q2");
  REQUIRE(q2.ok());
  CHECK(q2->text.attention_bias);
  CHECK_FALSE(q2->text.qk_norm);

  json sliding = Qwen3Config();
  sliding["use_sliding_window"] = true;
  auto refused = ParseModelConfig(sliding.dump(), "q3/config.json");
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message() ==
        "q3/config.json: use_sliding_window true is not supported (full attention only)");
  json bad_head = Qwen3Config();
  bad_head["head_dim"] = -4;
  CHECK(ParseModelConfig(bad_head.dump(), "q3").status().message() ==
        "q3: head_dim must be positive");
}

TEST_CASE("a Qwen3-MoE config: experts, top-k, sparse and dense layers", "[config]") {
  json j = Qwen3Config();  // Qwen3-30B-A3B's expert fields on Qwen3's shape
  j["model_type"] = "qwen3_moe";
  j["num_experts"] = 128;
  j["num_experts_per_tok"] = 8;
  j["moe_intermediate_size"] = 768;
  j["norm_topk_prob"] = true;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = json::array({3});
  auto cfg = ParseModelConfig(j.dump(), "moe/config.json");
  INFO(cfg.status().ToString());
  REQUIRE(cfg.ok());
  CHECK(cfg->text.num_experts == 128);
  CHECK(cfg->text.num_experts_per_tok == 8);
  CHECK(cfg->text.norm_topk_prob);
  CHECK(cfg->text.qk_norm);
  CHECK(cfg->text.moe_layer(0));
  CHECK_FALSE(cfg->text.moe_layer(3));
  json step2 = j;
  step2["decoder_sparse_step"] = 2;
  CHECK_FALSE(ParseModelConfig(step2.dump(), "m")->text.moe_layer(0));
  CHECK(ParseModelConfig(step2.dump(), "m")->text.moe_layer(1));

  json too_many = j;
  too_many["num_experts_per_tok"] = 129;
  CHECK(ParseModelConfig(too_many.dump(), "m").status().message() ==
        "m: num_experts_per_tok 129 is outside [1, num_experts 128]");
  json missing = j;
  missing.erase("moe_intermediate_size");
  CHECK(ParseModelConfig(missing.dump(), "m").status().message() ==
        "m: missing \"moe_intermediate_size\"");
}

TEST_CASE("a Qwen2.5-VL config: tower width, merger width, windows", "[config]") {
  // Qwen2.5-VL-3B-Instruct's vision_config on a Qwen2-VL text shape.
  json j = Qwen2Vl2bConfig();
  j["model_type"] = "qwen2_5_vl";
  j["vision_config"] = json::parse(R"({
    "depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
    "num_heads": 16, "in_chans": 3, "out_hidden_size": 1536, "patch_size": 14,
    "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
    "temporal_patch_size": 2})");
  auto cfg = ParseModelConfig(j.dump(), "q25/config.json");
  INFO(cfg.status().ToString());
  REQUIRE(cfg.ok());
  REQUIRE(cfg->vision.has_value());
  const VisionConfig& v = *cfg->vision;
  CHECK(v.arch == VisionConfig::Arch::kQwen25Vl);
  CHECK(v.embed_dim == 1280);
  CHECK(v.hidden_size == 1536);
  CHECK(v.intermediate_size == 3420);
  CHECK(v.window_size == 112);
  CHECK(v.fullatt_block_indexes == std::vector<int>{7, 15, 23, 31});
  json bad = j;
  bad["vision_config"]["window_size"] = 100;
  CHECK(ParseModelConfig(bad.dump(), "q").status().message() ==
        "q vision_config: window_size 100 must be a positive multiple of "
        "spatial_merge_size x patch_size 28");
  json no_vision = j;
  no_vision.erase("vision_config");
  CHECK(ParseModelConfig(no_vision.dump(), "q").status().message() ==
        "q: qwen2_5_vl config has no \"vision_config\"");
}

// The shape of Qwen3-VL-2B-Instruct's config.json.
json Qwen3Vl2bConfig() {
  return json::parse(R"({
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "image_token_id": 151655, "video_token_id": 151656, "model_type": "qwen3_vl",
    "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "tie_word_embeddings": true,
    "text_config": {
      "attention_bias": false, "bos_token_id": 151643, "dtype": "bfloat16",
      "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
      "intermediate_size": 6144, "max_position_embeddings": 262144,
      "model_type": "qwen3_vl_text", "num_attention_heads": 16, "num_hidden_layers": 28,
      "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
      "rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20],
                       "rope_type": "default"},
      "rope_theta": 5000000, "tie_word_embeddings": true, "vocab_size": 151936},
    "vision_config": {"deepstack_visual_indexes": [5, 11, 17], "depth": 24,
      "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1024, "in_channels": 3,
      "intermediate_size": 4096, "model_type": "qwen3_vl", "num_heads": 16,
      "num_position_embeddings": 2304, "out_hidden_size": 2048, "patch_size": 16,
      "spatial_merge_size": 2, "temporal_patch_size": 2}
  })");
}

TEST_CASE("a Qwen3-VL config: Qwen3 text, interleaved M-RoPE, DeepStack tower", "[config]") {
  auto cfg = ParseModelConfig(Qwen3Vl2bConfig().dump(), "q3vl/config.json");
  INFO(cfg.status().ToString());
  REQUIRE(cfg.ok());
  const TextConfig& t = cfg->text;
  CHECK(t.head_dim() == 128);
  CHECK(t.qk_norm);
  CHECK_FALSE(t.attention_bias);
  CHECK(t.tie_word_embeddings);
  CHECK(t.rope_theta == 5e6);
  CHECK(t.mrope_section == std::vector<int>{24, 20, 20});
  CHECK(t.mrope_interleaved);
  CHECK(cfg->torch_dtype == "bfloat16");  // text_config's "dtype"
  CHECK(cfg->tokens.image_pad == 151655);
  CHECK(cfg->tokens.eos == std::vector<int>{151645});
  REQUIRE(cfg->vision.has_value());
  const VisionConfig& v = *cfg->vision;
  CHECK(v.arch == VisionConfig::Arch::kQwen3Vl);
  CHECK(v.embed_dim == 1024);
  CHECK(v.hidden_size == 2048);
  CHECK(v.intermediate_size == 4096);
  CHECK(v.patch_size == 16);
  CHECK(v.num_position_embeddings == 2304);
  CHECK(v.deepstack_visual_indexes == std::vector<int>{5, 11, 17});
  CHECK(v.hidden_act == "gelu_pytorch_tanh");
  CHECK(cfg->DeepstackLevels() == 3);
  CHECK(cfg->EmbeddingRowWidth() == 4 * cfg->text.hidden_size);

  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* expect;
  };
  std::vector<Case> cases = {
      {"position grid", [](json& j) { j["vision_config"]["num_position_embeddings"] = 2300; },
       "num_position_embeddings 2300 must be a positive square"},
      {"deepstack block",
       [](json& j) {
         j["vision_config"]["deepstack_visual_indexes"] = {5, 24};
       },
       "deepstack_visual_indexes has block 24 outside [0, depth 24)"},
      {"deepstack layers", [](json& j) { j["text_config"]["num_hidden_layers"] = 2; },
       "deepstack_visual_indexes has 3 blocks, more than the language model's 2 layers"},
      {"deepstack order",
       [](json& j) {
         j["vision_config"]["deepstack_visual_indexes"] = {11, 5};
       },
       "deepstack_visual_indexes must be increasing"},
      {"vision activation", [](json& j) { j["vision_config"]["hidden_act"] = "relu"; },
       "hidden_act \"relu\" is not supported (gelu_pytorch_tanh)"},
      {"interleaved sections",
       [](json& j) {
         j["text_config"]["rope_scaling"]["mrope_section"] = {4, 30, 30};
       },
       "rope_scaling.mrope_interleaved needs 3 sections whose h and w pairs fit in head_dim / 2 "
       "= 64"},
      {"missing field", [](json& j) { j["vision_config"].erase("out_hidden_size"); },
       "missing \"out_hidden_size\""},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    json j = Qwen3Vl2bConfig();
    c.edit(j);
    auto bad = ParseModelConfig(j.dump(), "m/config.json");
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(bad.status().message().find(c.expect) != absl::string_view::npos);
  }
  auto qwen2vl = ParseModelConfig(Qwen2Vl2bConfig().dump(), "m");
  REQUIRE(qwen2vl.ok());
  CHECK_FALSE(qwen2vl->text.mrope_interleaved);
  CHECK(qwen2vl->DeepstackLevels() == 0);
  CHECK(qwen2vl->EmbeddingRowWidth() == qwen2vl->text.hidden_size);
}

TEST_CASE("inconsistent or unsupported configs name the problem", "[config]") {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* expect;
  };
  std::vector<Case> cases = {
      {"missing field", [](json& j) { j.erase("hidden_size"); }, "missing \"hidden_size\""},
      {"wrong type", [](json& j) { j["num_hidden_layers"] = "28"; },
       "\"num_hidden_layers\" has the wrong type"},
      {"mrope sum",
       [](json& j) {
         j["rope_scaling"]["mrope_section"] = {16, 24, 16};
       },
       "head_dim 128, but rope_scaling.mrope_section sums to 56"},
      {"wrong hidden_size", [](json& j) { j["hidden_size"] = 1152; },
       "hidden_size 1152 / num_attention_heads 12 gives head_dim 96, but "
       "rope_scaling.mrope_section sums to 64 (head_dim 128): check hidden_size and "
       "num_attention_heads (hidden_size 1536 would fit mrope_section)"},
      // Sums that overflowed an int, and negative sections that summed right.
      {"mrope overflow",
       [](json& j) {
         j["rope_scaling"]["mrope_section"] = {2147483647, 2147483647, 66};
       },
       "mrope_section sums to 4294967360"},
      {"mrope negative",
       [](json& j) {
         j["rope_scaling"]["mrope_section"] = {-8, 24, 48};
       },
       "negative section -8"},
      {"gqa ratio", [](json& j) { j["num_key_value_heads"] = 5; },
       "num_attention_heads 12 is not a multiple of num_key_value_heads 5"},
      {"heads", [](json& j) { j["num_attention_heads"] = 7; },
       "hidden_size 1536 is not a multiple of num_attention_heads 7"},
      {"model type", [](json& j) { j["model_type"] = "llava"; },
       "model_type \"llava\" is not supported (qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_vl_moe, "
       "qwen2, qwen3, qwen3_moe)"},
      {"rope type", [](json& j) { j["rope_scaling"]["type"] = "yarn"; },
       "rope_scaling type \"yarn\" is not supported"},
      // The newer key spelling, as Qwen3-VL's configs write it.
      {"rope_type",
       [](json& j) {
         j["rope_scaling"].erase("type");
         j["rope_scaling"]["rope_type"] = "linear";
       },
       "rope_scaling type \"linear\" is not supported"},
      {"vision width", [](json& j) { j["vision_config"]["hidden_size"] = 1024; },
       "vision_config.hidden_size 1024 differs"},
      {"no vision", [](json& j) { j.erase("vision_config"); }, "has no \"vision_config\""},
      {"activation", [](json& j) { j["hidden_act"] = "gelu"; }, "hidden_act \"gelu\""},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    json j = Qwen2Vl2bConfig();
    c.edit(j);
    auto cfg = ParseModelConfig(j.dump(), "m/config.json");
    REQUIRE_FALSE(cfg.ok());
    CHECK(cfg.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(cfg.status().message().find(c.expect) != absl::string_view::npos);
    CHECK(cfg.status().message().find("m/config.json") != absl::string_view::npos);
    CHECK(cfg.status().message().find('\n') == absl::string_view::npos);  // one line
  }
  CHECK_FALSE(ParseModelConfig("not json", "x").ok());
}

TEST_CASE("generation_config accepts eos as an int or a list", "[config]") {
  auto g = ParseGenerationConfig(R"({"eos_token_id": [151645, 151643], "temperature": 0.01,
                                    "top_k": 1, "top_p": 0.001})",
                                 "generation_config.json");
  REQUIRE(g.ok());
  CHECK(g->eos_token_ids == std::vector<int>{151645, 151643});
  CHECK(*g->top_k == 1);
  CHECK(*g->temperature == Approx(0.01f));
  CHECK_FALSE(g->repetition_penalty.has_value());
  auto single = ParseGenerationConfig(R"({"eos_token_id": 7})", "g");
  REQUIRE(single.ok());
  CHECK(single->eos_token_ids == std::vector<int>{7});
}

TEST_CASE("preprocessor_config reads both pixel-bound spellings and rejects bad bounds",
          "[config]") {
  auto old_style = ParsePreprocessorConfig(
      R"({"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "merge_size": 2,
          "temporal_patch_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]})",
      "p");
  REQUIRE(old_style.ok());
  CHECK(old_style->max_pixels == 12845056);
  CHECK(old_style->image_mean[1] == 0.5f);
  auto new_style =
      ParsePreprocessorConfig(R"({"size": {"shortest_edge": 3136, "longest_edge": 50176}})", "p");
  REQUIRE(new_style.ok());
  CHECK(new_style->min_pixels == 3136);
  CHECK(new_style->max_pixels == 50176);
  CHECK_FALSE(ParsePreprocessorConfig(R"({"min_pixels": 100, "max_pixels": 10})", "p").ok());
  CHECK_FALSE(ParsePreprocessorConfig(R"({"image_std": [0.5, 0, 0.5]})", "p").ok());
  CHECK_FALSE(ParsePreprocessorConfig(R"({"image_mean": [0.5]})", "p").ok());
  // Found by //fuzz:model_config_fuzzer: preprocessing sizes each patch as
  // 3 * temporal_patch_size * patch_size^2 values.
  CHECK_FALSE(ParsePreprocessorConfig(R"({"temporal_patch_size": 0})", "p").ok());
  CHECK_FALSE(ParsePreprocessorConfig(R"({"temporal_patch_size": -2})", "p").ok());
}

TEST_CASE(
    "video_preprocessor_config.json: Qwen3-VL's video settings, checked against the image's") {
  PreprocessorConfig image;
  image.patch_size = 16;
  const std::string origin = "video_preprocessor_config.json";
  auto v = ParseQwen3VideoSettings(
      R"({"video_processor_type": "Qwen3VLVideoProcessor", "fps": 1.5, "max_frames": 64,
          "size": {"shortest_edge": 4096, "longest_edge": 25165824}, "patch_size": 16})",
      origin, image);
  REQUIRE(v.ok());
  REQUIRE(v->has_value());
  CHECK((*v)->fps == 1.5);
  CHECK((*v)->min_frames == 4);
  CHECK((*v)->max_frames == 64);
  CHECK((*v)->min_pixels == 4096);
  CHECK((*v)->max_pixels == 25165824);
  // Absent bounds: Qwen3VLVideoProcessor's defaults.
  auto d = ParseQwen3VideoSettings(R"({"video_processor_type": "Qwen3VLVideoProcessor"})", origin,
                                   image);
  REQUIRE(d.ok());
  CHECK((*d)->min_pixels == 128 * 32 * 32);
  CHECK((*d)->max_pixels == 768 * 32 * 32);
  // Another processor's file: no Qwen3 settings.
  auto other = ParseQwen3VideoSettings(R"({"video_processor_type": "Qwen2VLVideoProcessor"})",
                                       origin, image);
  REQUIRE(other.ok());
  CHECK(!other->has_value());
  for (const char* bad : {
           R"({"video_processor_type": "Qwen3VLVideoProcessor", "patch_size": 14})",
           R"({"video_processor_type": "Qwen3VLVideoProcessor", "do_sample_frames": false})",
           R"({"video_processor_type": "Qwen3VLVideoProcessor", "fps": 0})",
           R"({"video_processor_type": "Qwen3VLVideoProcessor", "min_frames": 8, "max_frames": 4})",
       }) {
    INFO(bad);
    const absl::Status s = ParseQwen3VideoSettings(bad, origin, image).status();
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find(origin) != std::string::npos);
  }
}

}  // namespace
}  // namespace mmserve::model
