// Tokenizer, streaming detokenizer, chat format and config loader against the
// outputs of transformers 4.57.6 (model/testdata/tokenizer_golden.json and the
// tiny models), so that mmserve tokenizes exactly as Hugging Face does.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/file.h"
#include "model/chat_template.h"
#include "model/detokenizer.h"
#include "model/model_config.h"
#include "model/tokenizer.h"

namespace mmserve::model {
namespace {

using nlohmann::json;

constexpr char kData[] = "model/testdata/";

json Golden() {
  auto text = ReadFileToString(std::string(kData) + "tokenizer_golden.json");
  REQUIRE(text.ok());
  return json::parse(*text);
}

std::unique_ptr<Tokenizer> LoadTokenizer(const std::string& dir) {
  auto tok = Tokenizer::FromFile(dir + "/tokenizer.json");
  INFO(tok.status().ToString());
  REQUIRE(tok.ok());
  return std::move(*tok);
}

TEST_CASE("every golden string encodes to the HF ids and decodes back", "[hf_golden]") {
  json g = Golden();
  auto tok = LoadTokenizer(std::string(kData) + "tokenizer");
  CHECK(tok->vocab_size() == g["vocab_size_with_added"].get<int>());
  int cases = 0;
  for (const json& c : g["cases"]) {
    const std::string text = c["text"];
    INFO("case " << cases << ": " << json(text).dump());
    auto ids = tok->Encode(text);
    REQUIRE(ids.ok());
    CHECK(*ids == c["ids"].get<std::vector<int32_t>>());
    const auto want_ids = c["ids"].get<std::vector<int32_t>>();
    CHECK(*tok->Decode(want_ids) == c["decoded"].get<std::string>());
    CHECK(*tok->Decode(want_ids, true) == c["decoded_skip_special"].get<std::string>());
    IncrementalDetokenizer detok(*tok, /*skip_special=*/false);
    std::string streamed;
    for (int32_t id : want_ids) streamed += *detok.Push(id);
    streamed += detok.Flush();
    CHECK(streamed == c["decoded"].get<std::string>());
    ++cases;
  }
  CHECK(cases == 224);
}

std::vector<ChatMessage> ToChat(const json& messages) {
  std::vector<ChatMessage> out;
  for (const json& m : messages) {
    ChatMessage msg{m["role"], {}};
    if (m["content"].is_string()) {
      msg.parts.push_back({ChatPart::Kind::kText, m["content"]});
    } else {
      for (const json& part : m["content"]) {
        if (part["type"] == "image") {
          msg.parts.push_back({ChatPart::Kind::kImage, ""});
        } else {
          msg.parts.push_back({ChatPart::Kind::kText, part["text"]});
        }
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

TEST_CASE("chat renderings equal apply_chat_template text and ids", "[hf_golden]") {
  json g = Golden();
  auto tok = LoadTokenizer(std::string(kData) + "tokenizer");
  for (const json& c : g["chat"]) {
    INFO(c["name"].get<std::string>());
    ChatOptions opts;
    opts.add_generation_prompt = c.value("add_generation_prompt", true);
    opts.add_vision_id = c.value("add_vision_id", false);
    auto text = RenderQwen2VlChat(ToChat(c["messages"]), opts);
    REQUIRE(text.ok());
    CHECK(*text == c["rendered"].get<std::string>());
    CHECK(*tok->Encode(*text) == c["ids"].get<std::vector<int32_t>>());
  }
}

TEST_CASE("every golden model directory loads its config and tokenizer", "[hf_golden]") {
  for (const char* name : {"qwen2vl-tiny-mha-tied", "qwen2vl-tiny-gqa2-untied-sharded",
                           "qwen2vl-tiny-mqa-bf16", "qwen2vl-tiny-gqa8-padvocab-nested"}) {
    INFO(name);
    const std::string dir = std::string(kData) + "models/" + name;
    auto cfg = LoadModelConfig(dir);
    INFO(cfg.status().ToString());
    REQUIRE(cfg.ok());
    CHECK(cfg->text.num_hidden_layers == 2);
    CHECK(cfg->vision.has_value());
    CHECK(cfg->text.mrope_section.size() == 3);
    CHECK(cfg->preprocessor.has_value());
    CHECK(cfg->tokens.image_pad == 2060);
    auto tok = LoadTokenizer(dir);
    CHECK(tok->vocab_size() <= cfg->text.vocab_size);
  }
}

}  // namespace
}  // namespace mmserve::model
