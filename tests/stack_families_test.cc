// Each model family beyond the demo's Qwen2-VL through the whole stack
// (router, encoder, language as separate processes, real gRPC and UCX)
// against the in-process engine on the same checkpoint: the tiny random
// checkpoints of model/testdata/models (written by transformers, whose
// goldens the model tests match). Qwen2.5-VL with a video sampled at 1 fps
// (its time positions scaled) and an image; Qwen2.5 (model_type qwen2),
// Qwen3 and Qwen3-MoE on text.
// Each runs as role both, as prefill + decode --tp=2 (the media spans and
// their time step cross the hand-off) and as an elastic degree-2 group (a
// prompt beyond one instance's pool), each family over shm and over tcp;
// every answer must be the engine's tokens, and nothing may be left behind.
#include <catch2/catch.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/grpc_server.h"
#include "model/image_decode.h"
#include "model/image_preprocess.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "model/video_request.h"
#include "model/vision_tower.h"
#include "tests/stack_harness.h"
#include "worker/engine.h"

namespace mmserve::testing {
namespace {

constexpr char kClip[] = "h264_96x64_21f.mp4";
constexpr double kFps = 1.0;  // Qwen2.5-VL: 2 s a temporal patch, time step 4
constexpr char kVideo[] = "<|vision_start|><|video_pad|><|vision_end|>";
constexpr char kImage[] = "<|vision_start|><|image_pad|><|vision_end|>";
constexpr int kMaxTokens = 12;

std::string ModelDir(const std::string& name) {
  return RunfilesRoot() + "/model/testdata/models/" + name;
}

std::string ClipBytes() {
  return ReadFileToString(RunfilesRoot() + "/model/testdata/video/clips/" + kClip).value();
}

std::string ImageBytes() {
  const DemoSet& set = Demo();
  return set.images.at(set.items[0].image_file);
}

// A prompt: `words` words of text (about one token each), and for a vision
// family the clip and an image in its middle.
struct Prompt {
  std::string text;
  bool media = false;
};

Prompt MakePrompt(int words, bool media) {
  std::string head, tail;
  for (int i = 0; i < words; ++i) {
    absl::StrAppend(i < words / 2 ? &head : &tail, i % 7 == 0 ? " square" : " circle");
  }
  Prompt p;
  p.media = media;
  p.text = media ? absl::StrCat("Look:", head, kVideo, " then ", kImage, tail, " Which shapes?")
                 : absl::StrCat("Count:", head, tail, " How many?");
  return p;
}

mmserve::v1::GenerateRequest Request(const Prompt& p) {
  mmserve::v1::GenerateRequest r;
  r.mutable_raw()->set_text(p.text);
  if (p.media) {
    mmserve::v1::Video* v = r.mutable_raw()->add_videos();
    v->set_data(ClipBytes());
    v->set_fps(kFps);
    r.mutable_raw()->add_images()->set_data(ImageBytes());
  }
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_max_tokens(kMaxTokens);
  r.mutable_sampling()->set_ignore_eos(true);
  r.mutable_stream()->set_include_token_ids(true);
  return r;
}

// The in-process engine's tokens: the clip and image preprocessed and
// encoded here by the checkpoint's tower, the video's time step from its fps.
std::vector<int32_t> InProcess(const std::string& model, const Prompt& p) {
  const std::string dir = ModelDir(model);
  worker::EngineRequest req;
  req.id = "reference";
  req.prompt = p.text;
  if (p.media) {
    const model::ModelConfig config = model::LoadModelConfig(dir).value();
    auto ckpt = model::SafetensorsCheckpoint::Open(dir).value();
    auto tower = model::VisionTower::Load(*ckpt, config).value();
    mmserve::v1::Video video;
    video.set_data(ClipBytes());
    video.set_fps(kFps);
    std::vector<model::ImagePatches> media;
    media.push_back(
        model::LoadVideo(video, *config.preprocessor, model::VideoLimits(), model::DecodeLimits())
            .value());
    media.back().grid.time_step = config.VideoTimeStep(kFps);
    const model::RgbImage rgb = model::DecodeImage(ImageBytes(), model::DecodeLimits()).value();
    media.push_back(model::PreprocessImage(rgb, *config.preprocessor).value());
    for (const model::ImagePatches& m : media) {
      worker::MediaEmbedding e;
      e.grid = m.grid;
      e.values = tower->Forward(m.values, std::vector<model::MediaGrid>{m.grid}).value();
      req.image_embeddings.push_back(std::move(e));
    }
  }
  absl::StatusOr<std::vector<int32_t>> ids = InProcessGreedy(dir, std::move(req), kMaxTokens);
  INFO(ids.status());
  REQUIRE(ids.ok());
  return *std::move(ids);
}

enum class Topology { kBoth, kPd, kElastic };

const char* Name(Topology t) {
  switch (t) {
    case Topology::kBoth:
      return "role both";
    case Topology::kPd:
      return "prefill + decode --tp=2";
    case Topology::kElastic:
      return "elastic degree-2 group";
  }
  return "";
}

struct Case {
  std::string model;
  bool vision = false;
  Topology topology = Topology::kBoth;
  std::string profile;
  // Words of an elastic prompt. Pools are 1 MiB: about 1000 tokens of these
  // checkpoints' KV (2 layers of 2 KV heads of 32, fp32), 2000 of the
  // MoE's and Qwen2.5's (heads of 16); 380 words are about 1500 of the tiny tokenizer's
  // tokens, 760 about 3000 (under a group's 4000).
  int elastic_words = 380;
};

// The prompt a case asks: short, or for a group longer than one pool.
Prompt PromptFor(const Case& c) {
  return MakePrompt(c.topology == Topology::kElastic ? c.elastic_words : 40, c.vision);
}

launcher::StackOptions StackFor(const Case& c) {
  // A text model has no vision tower for an encoder to load.
  launcher::StackOptions o = TestStackOptions(c.vision ? 1 : 0, c.profile);
  o.model_dir = ModelDir(c.model);
  switch (c.topology) {
    case Topology::kBoth:
      break;
    case Topology::kPd:
      o.prefill = 1;
      o.decode = 1;
      o.decode_args = {"--tp=2"};
      break;
    case Topology::kElastic:
      o.language_args = {"--kv_cache_mb=1", "--threads=1"};
      UseElasticPair(o);
      break;
  }
  return o;
}

TEST_CASE("Qwen2.5-VL, Qwen2.5, Qwen3 and Qwen3-MoE through the stack give the engine's tokens") {
  const std::vector<Case> cases = {
      {"qwen25vl-tiny", true, Topology::kBoth, "shm"},
      {"qwen25vl-tiny", true, Topology::kPd, "tcp"},
      {"qwen25vl-tiny", true, Topology::kElastic, "shm"},
      {"qwen25-tiny", false, Topology::kBoth, "tcp"},
      {"qwen25-tiny", false, Topology::kPd, "shm"},
      {"qwen25-tiny", false, Topology::kElastic, "tcp", 760},
      {"qwen3-tiny-qknorm", false, Topology::kBoth, "tcp"},
      {"qwen3-tiny-qknorm", false, Topology::kPd, "shm"},
      {"qwen3-tiny-qknorm", false, Topology::kElastic, "tcp"},
      {"qwen3moe-tiny-top2", false, Topology::kBoth, "shm"},
      {"qwen3moe-tiny-top2", false, Topology::kPd, "tcp"},
      {"qwen3moe-tiny-top2", false, Topology::kElastic, "shm", 760},
  };
  for (const Case& c : cases) {
    INFO(c.model << ", " << Name(c.topology) << ", " << c.profile);
    const Prompt prompt = PromptFor(c);
    const std::vector<int32_t> want = InProcess(c.model, prompt);
    auto stack = launcher::LocalStack::Start(StackFor(c));
    INFO(stack.status().ToString());
    REQUIRE(stack.ok());
    auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
    const Answer a = AskGrpc(*stub, Request(prompt), {});
    INFO(a.status.ToString());
    REQUIRE(a.status.ok());
    CHECK(a.token_ids == want);
    if (c.topology == Topology::kElastic) {
      // The prompt went to a group: neither instance's pool holds it.
      CHECK(ScrapeMetric((*stack)->router().metrics_port(), "mmserve_router_elastic_requests_total",
                         "degree=\"2\"") == 1);
    }
    const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(5));
    INFO(leaks.ToString());
    CHECK(leaks.zero());
  }
}

}  // namespace
}  // namespace mmserve::testing
