// Each family's tiny checkpoint (model/testdata/models, written by
// transformers) loads, and refuses at load, with one line naming the
// field, what mmserve does not serve: an unknown model_type, a rope scaling
// type other than the default (written wherever the family's config.json
// keeps rope_scaling), and a missing tensor of the language model or of
// the vision tower (NotFound naming the tensor).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/file.h"
#include "model/model_config.h"
#include "model/qwen2_weights.h"
#include "model/safetensors.h"
#include "model/vision_tower.h"

namespace mmserve::model {
namespace {

struct Family {
  const char* model;
  const char* text_tensor;    // a language-model tensor in the checkpoint
  const char* vision_tensor;  // a tower tensor, or null for a text model
};

const Family kFamilies[] = {
    {"qwen2vl-tiny-mha-tied", "model.layers.1.self_attn.k_proj.weight",
     "visual.blocks.1.attn.proj.weight"},
    {"qwen25vl-tiny", "model.layers.1.self_attn.k_proj.weight", "visual.blocks.1.attn.proj.weight"},
    {"qwen3vl-tiny", "model.language_model.layers.1.self_attn.k_proj.weight",
     "model.visual.blocks.1.attn.proj.weight"},
    {"qwen3vlmoe-tiny", "model.language_model.layers.1.self_attn.k_proj.weight",
     "model.visual.blocks.1.attn.qkv.weight"},
    {"qwen25-tiny", "model.layers.1.self_attn.k_proj.weight", nullptr},
    {"qwen3-tiny-qknorm", "model.layers.1.self_attn.k_proj.weight", nullptr},
    {"qwen3moe-tiny-top2", "model.layers.1.self_attn.k_proj.weight", nullptr},
};

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

std::string Source(const Family& f) { return std::string("model/testdata/models/") + f.model; }

// A fresh copy of `src` (a model directory).
std::string Copy(const std::string& src) {
  static int counter = 0;
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/family" + std::to_string(::getpid()) +
                          "_" + std::to_string(counter++);
  REQUIRE(std::system(("rm -rf " + dir + " && cp -rL " + src + " " + dir).c_str()) == 0);
  return dir;
}

void EditJson(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(ReadFileToString(path).value());
  edit(j);
  WriteFile(path, j.dump());
}

// The safetensors file of `dir` that holds `tensor` (the one file, or the
// shard model.safetensors.index.json names).
std::string FileHolding(const std::string& dir, const std::string& tensor) {
  auto index = ReadFileToString(dir + "/model.safetensors.index.json");
  if (!index.ok()) return dir + "/model.safetensors";
  const nlohmann::json j = nlohmann::json::parse(*index);
  return dir + "/" + j["weight_map"][tensor].get<std::string>();
}

// `dir` without `tensor`: renamed in its file's header (the data stays where
// it was) and, for a sharded checkpoint, in the index too.
void DropTensor(const std::string& dir, const std::string& tensor) {
  const std::string path = FileHolding(dir, tensor);
  const std::string st = ReadFileToString(path).value();
  uint64_t len;
  std::memcpy(&len, st.data(), 8);
  nlohmann::json header = nlohmann::json::parse(st.substr(8, len));
  REQUIRE(header.contains(tensor));
  header["unused.renamed"] = header[tensor];
  header.erase(tensor);
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  const uint64_t new_len = h.size();
  std::string out(reinterpret_cast<const char*>(&new_len), 8);
  out += h + st.substr(8 + len);
  WriteFile(path, out);
  if (path != dir + "/model.safetensors") {
    EditJson(dir + "/model.safetensors.index.json", [&](nlohmann::json& j) {
      j["weight_map"]["unused.renamed"] = j["weight_map"][tensor];
      j["weight_map"].erase(tensor);
    });
  }
}

// Loads what the language service and the encoder load: the config, the
// language model's weights and, for a vision family, the tower.
absl::Status Load(const std::string& dir) {
  absl::StatusOr<ModelConfig> cfg = LoadModelConfig(dir);
  if (!cfg.ok()) return cfg.status();
  auto ckpt = SafetensorsCheckpoint::Open(dir);
  if (!ckpt.ok()) return ckpt.status();
  if (auto w = Qwen2Weights::Load(**ckpt, cfg->text); !w.ok()) return w.status();
  if (cfg->vision.has_value()) {
    if (auto t = VisionTower::Load(**ckpt, *cfg); !t.ok()) return t.status();
  }
  return absl::OkStatus();
}

bool OneLineNaming(const absl::Status& s, const std::string& text) {
  const std::string m(s.message());
  return m.find(text) != std::string::npos && m.find('\n') == std::string::npos;
}

TEST_CASE("every family's checkpoint loads as it is", "[families]") {
  for (const Family& f : kFamilies) {
    INFO(f.model);
    const absl::Status s = Load(Source(f));
    INFO(s.ToString());
    CHECK(s.ok());
  }
}

TEST_CASE("every family refuses an unknown model_type, naming it", "[families]") {
  for (const Family& f : kFamilies) {
    INFO(f.model);
    const std::string dir = Copy(Source(f));
    EditJson(dir + "/config.json", [](nlohmann::json& j) { j["model_type"] = "llava"; });
    const absl::Status s = Load(dir);
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(OneLineNaming(s, "model_type \"llava\" is not supported"));
  }
}

TEST_CASE("every family refuses a rope scaling type it does not compute, naming it", "[families]") {
  for (const Family& f : kFamilies) {
    INFO(f.model);
    const std::string dir = Copy(Source(f));
    EditJson(dir + "/config.json", [](nlohmann::json& j) {
      // Where the family keeps it (a VL config may keep it twice, as
      // transformers saves them); a text config without one gets one.
      bool written = false;
      for (nlohmann::json* c : {&j, j.contains("text_config") ? &j["text_config"] : nullptr}) {
        if (c == nullptr || !c->contains("rope_scaling") || (*c)["rope_scaling"].is_null()) {
          continue;
        }
        (*c)["rope_scaling"]["rope_type"] = "yarn";
        (*c)["rope_scaling"]["type"] = "yarn";
        (*c)["rope_scaling"]["factor"] = 4.0;
        written = true;
      }
      if (!written) j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
    });
    const absl::Status s = Load(dir);
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(OneLineNaming(s, "rope_scaling type \"yarn\" is not supported"));
  }
}

TEST_CASE("every family refuses a checkpoint missing a tensor, naming it", "[families]") {
  for (const Family& f : kFamilies) {
    std::vector<const char*> tensors = {f.text_tensor};
    if (f.vision_tensor != nullptr) tensors.push_back(f.vision_tensor);
    for (const char* tensor : tensors) {
      INFO(f.model << ": " << tensor);
      const std::string dir = Copy(Source(f));
      DropTensor(dir, tensor);
      const absl::Status s = Load(dir);
      INFO(s.ToString());
      CHECK(s.code() == absl::StatusCode::kNotFound);
      CHECK(OneLineNaming(s, tensor));
    }
  }
}

}  // namespace
}  // namespace mmserve::model
