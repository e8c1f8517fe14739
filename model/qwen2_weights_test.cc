#include "model/qwen2_weights.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/cpu/thread_pool.h"
#include "model/model_config.h"
#include "model/safetensors.h"

namespace mmserve::model {
namespace {

const std::string kTied = "model/testdata/models/qwen2vl-tiny-mha-tied";
const std::string kBf16 = "model/testdata/models/qwen2vl-tiny-mqa-bf16";
const std::string kUntied = "model/testdata/models/qwen2vl-tiny-gqa2-untied-sharded";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A copy of a one-file model directory whose safetensors header went through
// `edit` (the data section is kept; offsets are left as they were).
std::string EditedModel(const std::string& src, const std::function<void(nlohmann::json&)>& edit,
                        size_t truncate_by = 0) {
  static int counter = 0;
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/w" + std::to_string(::getpid()) +
                          "_" + std::to_string(counter++);
  REQUIRE(std::system(("mkdir -p " + dir).c_str()) == 0);
  WriteFile(dir + "/config.json", ReadFile(src + "/config.json"));
  std::string st = ReadFile(src + "/model.safetensors");
  uint64_t len;
  std::memcpy(&len, st.data(), 8);
  nlohmann::json header = nlohmann::json::parse(st.substr(8, len));
  edit(header);
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  uint64_t new_len = h.size();
  std::string out(reinterpret_cast<const char*>(&new_len), 8);
  out += h + st.substr(8 + len);
  out.resize(out.size() - truncate_by);
  WriteFile(dir + "/model.safetensors", out);
  return dir;
}

absl::Status LoadStatus(const std::string& dir) {
  auto cfg = LoadModelConfig(dir);
  REQUIRE(cfg.ok());
  auto ckpt = SafetensorsCheckpoint::Open(dir);
  if (!ckpt.ok()) return ckpt.status();
  return Qwen2Weights::Load(**ckpt, cfg->text).status();
}

bool Contains(const absl::Status& s, const std::string& text) {
  return s.ToString().find(text) != std::string::npos;
}

TEST_CASE("fp32 matrices point into the mapping; bf16 ones are packed with the same values",
          "[weights]") {
  for (const std::string& dir : {kTied, kBf16, kUntied}) {
    auto cfg = LoadModelConfig(dir);
    REQUIRE(cfg.ok());
    auto ckpt = SafetensorsCheckpoint::Open(dir);
    REQUIRE(ckpt.ok());
    auto w = Qwen2Weights::Load(**ckpt, cfg->text);
    INFO(dir << ": " << w.status());
    REQUIRE(w.ok());
    const std::string prefix = "model.layers.1.";
    const TensorView* down = (*ckpt)->Find(prefix + "mlp.down_proj.weight");
    REQUIRE(down != nullptr);
    const cpu::WeightMatrix& m = (*w)->layers()[1].down;
    CHECK(m.dtype == down->dtype);
    CHECK((*w)->layers().size() == static_cast<size_t>(cfg->text.num_hidden_layers));
    if (down->dtype == DType::kF32) {
      // No copy: the matrix is the mapped tensor.
      CHECK(m.data == down->data);
      CHECK(m.layout == cpu::WeightLayout::kRows);
    } else {
      CHECK(m.layout == cpu::WeightLayout::kPanels);
      // Every row reads back as the checkpoint's (the mapping stays valid
      // after its pages were dropped: they come back from the file).
      std::vector<float> got(m.cols), want(m.cols);
      const cpu::WeightMatrix mapped{DType::kBF16, down->data, m.rows, m.cols};
      for (int64_t r = 0; r < m.rows; ++r) {
        cpu::WeightRowToF32(m, r, got.data());
        cpu::WeightRowToF32(mapped, r, want.data());
        REQUIRE(got == want);
      }
    }
    if (cfg->text.tie_word_embeddings) {
      CHECK((*w)->lm_head().data == (*w)->embed().data);
    } else {
      const TensorView* head = (*ckpt)->Find("lm_head.weight");
      CHECK(((*w)->lm_head().data == head->data) == (head->dtype == DType::kF32));
      CHECK((*w)->embed().layout == cpu::WeightLayout::kRows);
    }
    CHECK((*w)->TotalWeightBytes() <= (*ckpt)->TotalBytes());
  }
}

TEST_CASE("the transformers >= 4.52 layout model.language_model.* loads too", "[weights]") {
  std::string dir = EditedModel(kTied, [](nlohmann::json& h) {
    nlohmann::json renamed;
    for (auto& [name, v] : h.items()) {
      std::string n = name;
      if (n.rfind("model.", 0) == 0) n = "model.language_model." + n.substr(6);
      if (n.rfind("visual.", 0) == 0) n = "model." + n;
      renamed[n] = v;
    }
    h = renamed;
  });
  CHECK(LoadStatus(dir).ok());
}

TEST_CASE("a missing tensor is NotFound naming it and its expected shape", "[weights]") {
  std::string dir = EditedModel(kTied, [](nlohmann::json& h) {
    // Keep the data contiguous: turn the tensor into an unused name.
    h["renamed.k_proj"] = h["model.layers.1.self_attn.k_proj.weight"];
    h.erase("model.layers.1.self_attn.k_proj.weight");
  });
  absl::Status s = LoadStatus(dir);
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(Contains(s, "model.layers.1.self_attn.k_proj.weight"));
  CHECK(Contains(s, "[64, 64]"));
}

TEST_CASE("an untied model without lm_head.weight is NotFound", "[weights]") {
  auto cfg = LoadModelConfig(kTied);
  REQUIRE(cfg.ok());
  cfg->text.tie_word_embeddings = false;
  auto ckpt = SafetensorsCheckpoint::Open(kTied);
  REQUIRE(ckpt.ok());
  absl::Status s = Qwen2Weights::Load(**ckpt, cfg->text).status();
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(Contains(s, "lm_head.weight"));
}

TEST_CASE("a wrong shape is InvalidArgument with expected vs actual", "[weights]") {
  std::string dir = EditedModel(kTied, [](nlohmann::json& h) {
    h["model.layers.0.mlp.up_proj.weight"]["shape"] = {64, 128};  // transposed
  });
  absl::Status s = LoadStatus(dir);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(s, "model.layers.0.mlp.up_proj.weight"));
  CHECK(Contains(s, "has shape [64, 128], expected [128, 64]"));
}

TEST_CASE("a config that disagrees with the checkpoint names the first mismatching tensor",
          "[weights]") {
  auto cfg = LoadModelConfig(kTied);
  REQUIRE(cfg.ok());
  cfg->text.intermediate_size = 96;
  auto ckpt = SafetensorsCheckpoint::Open(kTied);
  REQUIRE(ckpt.ok());
  absl::Status s = Qwen2Weights::Load(**ckpt, cfg->text).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(s, "model.layers.0.mlp.gate_proj.weight"));
  CHECK(Contains(s, "expected [96, 64]"));
}

TEST_CASE("a dtype the model cannot compute in is InvalidArgument", "[weights]") {
  // I16 has BF16's size, so the file stays valid; the loader refuses it.
  // (F16 is taken: qwen2_f16_test.)
  std::string dir = EditedModel(kBf16, [](nlohmann::json& h) {
    h["model.layers.0.self_attn.o_proj.weight"]["dtype"] = "I16";
  });
  absl::Status s = LoadStatus(dir);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(s, "model.layers.0.self_attn.o_proj.weight"));
  CHECK(Contains(s, "dtype I16"));
  CHECK(Contains(s, "expected F32, BF16 or F16"));
}

TEST_CASE("an unknown dtype string and a truncated file fail when the checkpoint opens",
          "[weights]") {
  std::string unknown =
      EditedModel(kBf16, [](nlohmann::json& h) { h["model.norm.weight"]["dtype"] = "F8_E4M3"; });
  absl::Status s = LoadStatus(unknown);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(s, "model.norm.weight"));
  std::string truncated = EditedModel(
      kTied, [](nlohmann::json&) {}, /*truncate_by=*/100);
  s = LoadStatus(truncated);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(s, "model.safetensors"));
}

std::string CopyDir(const std::string& src, const std::vector<std::string>& skip) {
  static int counter = 0;
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/c" + std::to_string(::getpid()) +
                          "_" + std::to_string(counter++);
  REQUIRE(std::system(("mkdir -p " + dir + " && cp -L " + src + "/* " + dir).c_str()) == 0);
  for (const std::string& f : skip) REQUIRE(std::remove((dir + "/" + f).c_str()) == 0);
  return dir;
}

TEST_CASE("a directory without weights, or missing a listed shard, names the missing file",
          "[weights]") {
  absl::Status s = LoadStatus(CopyDir(kTied, {"model.safetensors"}));
  CHECK_FALSE(s.ok());
  CHECK(Contains(s, "model.safetensors"));
  s = LoadStatus(CopyDir(kUntied, {"model-00003-of-00004.safetensors"}));
  CHECK_FALSE(s.ok());
  CHECK(Contains(s, "model-00003-of-00004.safetensors"));
}

TEST_CASE("random weights have the configured shapes and dtype", "[weights]") {
  TextConfig cfg;
  cfg.vocab_size = 100;
  cfg.hidden_size = 32;
  cfg.intermediate_size = 48;
  cfg.num_hidden_layers = 3;
  cfg.num_attention_heads = 4;
  cfg.num_key_value_heads = 2;
  cfg.tie_word_embeddings = true;
  auto w = Qwen2Weights::Random(cfg, DType::kBF16, 1);
  REQUIRE(w->layers().size() == 3);
  CHECK(w->layers()[2].k.rows == 16);
  CHECK(w->layers()[2].k.dtype == DType::kBF16);
  CHECK(w->layers()[0].down.cols == 48);
  CHECK(w->lm_head().data == w->embed().data);
  CHECK(w->layers()[2].k.layout == cpu::WeightLayout::kPanels);
  // 3 layers x (q 32x32 + k,v 16x32 + o 32x32 + 3 x 48x32) + lm_head 100x32
  // stored as 7 panels of 16 rows (112x32), 2 bytes each.
  CHECK(w->StepWeightBytes() == size_t{2} * (3 * (1024 + 512 + 512 + 1024 + 3 * 1536) + 3584));
}

TEST_CASE("--quantize=int8 quantizes every projection and lm_head from the checkpoint values",
          "[weights][int8]") {
  for (const char* name : {"int8", "int8_g32"}) {
    auto options = ParseQuantize(name);
    REQUIRE(options.ok());
    cpu::ThreadPool pool(1);
    for (const std::string& dir : {kTied, kBf16, kUntied}) {
      auto cfg = LoadModelConfig(dir);
      REQUIRE(cfg.ok());
      auto ckpt = SafetensorsCheckpoint::Open(dir);
      REQUIRE(ckpt.ok());
      auto w = Qwen2Weights::Load(**ckpt, cfg->text, *options);
      INFO(name << " " << dir << ": " << w.status());
      REQUIRE(w.ok());
      for (const Qwen2LayerWeights& l : (*w)->layers()) {
        for (const cpu::WeightMatrix* m : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) {
          CHECK(m->dtype == DType::kI8);
          CHECK(m->group == (options->int8_group >= m->cols ? 0 : options->int8_group));
        }
      }
      CHECK((*w)->lm_head().dtype == DType::kI8);
      // Values: exactly Int8Weights::Quantize of the tensor as stored.
      const TensorView* down = (*ckpt)->Find("model.layers.1.mlp.down_proj.weight");
      const cpu::WeightMatrix& m = (*w)->layers()[1].down;
      const cpu::Int8Weights want = cpu::Int8Weights::Quantize(
          pool, {down->dtype, down->data, m.rows, m.cols}, options->int8_group);
      std::vector<float> a(m.cols), b(m.cols);
      for (int64_t r = 0; r < m.rows; ++r) {
        cpu::WeightRowToF32(m, r, a.data());
        cpu::WeightRowToF32(want.matrix(), r, b.data());
        REQUIRE(a == b);
      }
      if (cfg->text.tie_word_embeddings) {
        CHECK((*w)->embed().data == (*w)->lm_head().data);  // gathered from the int8 table
      } else {
        CHECK((*w)->embed().dtype != DType::kI8);  // only gathered from: kept as stored
      }
    }
  }
  CHECK(ParseQuantize("")->quantize == Quantization::kNone);
  CHECK(ParseQuantize("none")->quantize == Quantization::kNone);
  CHECK(ParseQuantize("int4").status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("--quantize=int4_* quantizes every projection and lm_head from the checkpoint values",
          "[weights][int4]") {
  for (const char* name : {"int4_g32", "int4_g128", "int4_g32_zp", "int4_g128_zp"}) {
    auto options = ParseQuantize(name);
    REQUIRE(options.ok());
    REQUIRE(options->quantize == Quantization::kInt4);
    cpu::ThreadPool pool(1);
    for (const std::string& dir : {kTied, kUntied}) {
      auto cfg = LoadModelConfig(dir);
      REQUIRE(cfg.ok());
      auto ckpt = SafetensorsCheckpoint::Open(dir);
      REQUIRE(ckpt.ok());
      auto w = Qwen2Weights::Load(**ckpt, cfg->text, *options);
      INFO(name << " " << dir << ": " << w.status());
      REQUIRE(w.ok());
      for (const Qwen2LayerWeights& l : (*w)->layers()) {
        for (const cpu::WeightMatrix* m : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) {
          CHECK(m->dtype == DType::kI4);
          CHECK(m->group == options->int4.group);
          CHECK((m->zeros != nullptr) == options->int4.zero_point);
        }
      }
      CHECK((*w)->lm_head().dtype == DType::kI4);
      // Values: exactly Int4Weights::Quantize of the tensor as stored.
      const TensorView* down = (*ckpt)->Find("model.layers.1.mlp.down_proj.weight");
      const cpu::WeightMatrix& m = (*w)->layers()[1].down;
      const cpu::Int4Weights want = cpu::Int4Weights::Quantize(
          pool, {down->dtype, down->data, m.rows, m.cols}, options->int4);
      std::vector<float> a(m.cols), b(m.cols);
      for (int64_t r = 0; r < m.rows; ++r) {
        cpu::WeightRowToF32(m, r, a.data());
        cpu::WeightRowToF32(want.matrix(), r, b.data());
        REQUIRE(a == b);
      }
      if (cfg->text.tie_word_embeddings) {
        CHECK((*w)->embed().data == (*w)->lm_head().data);  // gathered from the int4 table
      } else {
        CHECK((*w)->embed().dtype != DType::kI4);  // only gathered from: kept as stored
      }
    }
  }
  CHECK(ParseQuantize("int4_g128_zp")->int4.group == 128);
  CHECK(ParseQuantize("int4_g128_zp")->int4.zero_point);
  CHECK_FALSE(ParseQuantize("int4_g32")->int4.zero_point);
  for (const char* bad : {"int4_g64", "int4_zp", "INT4_G32", "int4_g32_", "int4_g128zp"}) {
    const absl::Status s = ParseQuantize(bad).status();
    INFO(bad << ": " << s);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find("--quantize") != std::string::npos);
    CHECK(s.message().find("int4_g128_zp") != std::string::npos);  // lists what is accepted
  }
}

TEST_CASE("random int4 weights count nibbles, scales and zero points as their bytes",
          "[weights][int4]") {
  TextConfig cfg;
  cfg.vocab_size = 100;
  cfg.hidden_size = 32;
  cfg.intermediate_size = 48;
  cfg.num_hidden_layers = 3;
  cfg.num_attention_heads = 4;
  cfg.num_key_value_heads = 2;
  cfg.tie_word_embeddings = true;
  auto w = Qwen2Weights::Random(cfg, DType::kBF16, 1, *ParseQuantize("int4_g32_zp"));
  CHECK(w->layers()[2].k.dtype == DType::kI4);
  CHECK(w->lm_head().data == w->embed().data);
  // Stored rows as for int8, k padded to 32 (32 and 64 columns: no padding
  // but down's 48 -> 64), half a byte each, plus per row and group an fp32
  // scale and a zero-point byte (one group of 32 columns; down two).
  const size_t rows32 = 3 * (32 + 16 + 16 + 32 + 48 + 48) + 112, rows64 = 3 * 32;
  CHECK(w->StepWeightBytes() == rows32 * (16 + 5) + rows64 * (32 + 2 * 5));
}

TEST_CASE("random int8 weights count values plus scales as their bytes", "[weights][int8]") {
  TextConfig cfg;
  cfg.vocab_size = 100;
  cfg.hidden_size = 32;
  cfg.intermediate_size = 48;
  cfg.num_hidden_layers = 3;
  cfg.num_attention_heads = 4;
  cfg.num_key_value_heads = 2;
  cfg.tie_word_embeddings = true;
  auto w = Qwen2Weights::Random(cfg, DType::kBF16, 1, *ParseQuantize("int8"));
  CHECK(w->layers()[2].k.dtype == DType::kI8);
  CHECK(w->lm_head().data == w->embed().data);
  // Values (1 byte) as for bf16 above, plus one fp32 scale per stored row:
  // per layer 32 + 16 + 16 + 32 + 48 + 48 + 32 rows, lm_head 112.
  CHECK(w->StepWeightBytes() == size_t{1} * (3 * (1024 + 512 + 512 + 1024 + 3 * 1536) + 3584) +
                                    4 * (3 * (32 + 16 + 16 + 32 + 48 + 48 + 32) + 112));
}

}  // namespace
}  // namespace mmserve::model
