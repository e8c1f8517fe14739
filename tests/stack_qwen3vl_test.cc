// Qwen3-VL and Qwen3-VL-MoE through the whole stack (router, encoder,
// language as separate processes, real gRPC and UCX) against the in-process
// engine on the tiny random checkpoints (model/testdata/models/qwen3vl-tiny
// and qwen3vlmoe-tiny, whose goldens the model tests match). Each prompt
// holds two images of different sizes (the elastic one the two again near
// its end); the in-process answer without the DeepStack features differs,
// so a path that lost them fails. Every image token's row carries its
// DeepStack features beside its embedding from the encoder to the language
// model, which adds them after the first decoder layers. Role both with
// prefill chunks that end inside an image, and with --tp=2 (the second rank
// reads rows and features in place); prefill + decode --tp=2, the prefill
// instance's chunks again ending inside an image (the features are in the
// KV the decode side receives); an elastic degree-2 group whose row split
// falls inside an image (each member adds the features of its own rows).
// The MoE checkpoint as role both, as prefill + decode --tp=2 (each
// decode rank computes its share of every expert's width) and as an elastic
// degree-2 group (each member routes its own rows' tokens to the experts
// and adds their features). A Qwen3-VL video
// (a clip sampled at the processor's 2 fps) as role both, prefill + decode
// and in an elastic degree-2 group whose row split falls inside one of its
// temporal patches: the router reads its frames' timestamps from the header
// (and counts their text in the prompt's length), the language side writes
// "<t seconds>" before each temporal patch, and the answer is the engine's
// on the prompt and embeddings built here; the MoE
// checkpoint, which has no Qwen3-VL video processor config, refuses videos
// naming the reason. Over shm and tcp; every answer must be the engine's
// tokens, and nothing may be left behind.
#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/grpc_server.h"
#include "model/image_decode.h"
#include "model/image_preprocess.h"
#include "model/model_config.h"
#include "model/qwen3vl_video.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "model/video_request.h"
#include "model/vision_tower.h"
#include "tests/stack_harness.h"
#include "worker/engine.h"

namespace mmserve::testing {
namespace {

constexpr char kImage[] = "<|vision_start|><|image_pad|><|vision_end|>";
constexpr char kVideo[] = "<|vision_start|><|video_pad|><|vision_end|>";
constexpr char kClip[] = "/model/testdata/video/clips/h264_96x64_21f.mp4";
constexpr int kMaxTokens = 12;

constexpr char kDense[] = "qwen3vl-tiny";
constexpr char kMoe[] = "qwen3vlmoe-tiny";

std::string ModelDir(const std::string& model) {
  return RunfilesRoot() + "/model/testdata/models/" + model;
}

// `n` images: 84 x 84 (3 x 3 merged tokens here) and 64 x 48 (2 x 2) in
// turn.
std::vector<std::string> Images(int n) {
  const DemoSet& set = Demo();
  const std::string two[] = {
      set.images.at(set.items[0].image_file),
      ReadFileToString(RunfilesRoot() + "/model/testdata/images/gray.png").value()};
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(two[i % 2]);
  return out;
}

// A prompt and its number of images.
struct Prompt {
  std::string text;
  int images = 2;
};

// Words of text.
std::string Words(int n, int from) {
  static const char* const kWords[] = {" red", " square", " and", " blue", " circle", " left"};
  std::string s;
  for (int i = from; i < from + n; ++i) absl::StrAppend(&s, kWords[i % 6]);
  return s;
}

// A chat as Qwen3-VL's template renders it: two images between words
// (with `again`, the two once more near its end).
Prompt MakePrompt(int head, int middle, int tail, bool again = false) {
  Prompt p;
  p.text = absl::StrCat(
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nCompare",
      Words(head, 0), " ", kImage, Words(middle, head), " ", kImage, Words(tail, head + middle));
  if (again) {
    absl::StrAppend(&p.text, ". Then ", kImage, " and ", kImage);
    p.images = 4;
  }
  absl::StrAppend(&p.text, ". Which is wider?<|im_end|>\n<|im_start|>assistant\n");
  return p;
}

// Each image's embedding rows as the encoder computes them: the main
// embedding, then its DeepStack features.
std::vector<worker::MediaEmbedding> Encode(const std::string& model, int n) {
  const std::string dir = ModelDir(model);
  const model::ModelConfig config = model::LoadModelConfig(dir).value();
  auto ckpt = model::SafetensorsCheckpoint::Open(dir).value();
  auto tower = model::VisionTower::Load(*ckpt, config).value();
  std::vector<worker::MediaEmbedding> out;
  for (const std::string& bytes : Images(n)) {
    const model::RgbImage rgb = model::DecodeImage(bytes, model::DecodeLimits()).value();
    const model::ImagePatches p = model::PreprocessImage(rgb, *config.preprocessor).value();
    worker::MediaEmbedding e;
    e.grid = p.grid;
    auto all = tower->ForwardAll(p.values, std::vector<model::MediaGrid>{p.grid}).value();
    REQUIRE(static_cast<int>(all.deepstack.size()) == config.DeepstackLevels());
    e.values = model::TokenRows(std::move(all), config.text.hidden_size);
    out.push_back(std::move(e));
  }
  if (n >= 2) REQUIRE(out[0].grid.num_tokens() != out[1].grid.num_tokens());  // sizes differ
  return out;
}

mmserve::v1::GenerateRequest Request(const Prompt& p) {
  mmserve::v1::GenerateRequest r;
  r.mutable_raw()->set_text(p.text);
  for (const std::string& bytes : Images(p.images)) {
    r.mutable_raw()->add_images()->set_data(bytes);
  }
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_max_tokens(kMaxTokens);
  r.mutable_sampling()->set_ignore_eos(true);
  r.mutable_stream()->set_include_token_ids(true);
  return r;
}

// Every DeepStack feature of `media` zero: what a path that dropped them
// would compute.
void DropDeepstack(const std::string& model, std::vector<worker::MediaEmbedding>& media) {
  const model::ModelConfig config = model::LoadModelConfig(ModelDir(model)).value();
  const int64_t hidden = config.text.hidden_size;
  const int64_t width = config.EmbeddingRowWidth();
  for (worker::MediaEmbedding& e : media) {
    for (size_t r = 0; r < e.values.size(); r += width) {
      std::fill(e.values.begin() + r + hidden, e.values.begin() + r + width, 0.0f);
    }
  }
}

// The in-process engine's tokens; with `deepstack` false, every DeepStack
// feature zero.
std::vector<int32_t> InProcess(const std::string& model, const Prompt& p, bool deepstack = true) {
  worker::EngineRequest req;
  req.id = "reference";
  req.prompt = p.text;
  req.image_embeddings = Encode(model, p.images);
  if (!deepstack) DropDeepstack(model, req.image_embeddings);
  absl::StatusOr<std::vector<int32_t>> ids =
      InProcessGreedy(ModelDir(model), std::move(req), kMaxTokens);
  INFO(ids.status());
  REQUIRE(ids.ok());
  return *std::move(ids);
}

// A prompt of about `words` words, `middle` of them between its two images
// (and the two again near its end), whose expanded token row len / 2 (where
// a degree-2 group splits its rows) falls inside the second image, not on
// its first row, and whose answer on `model` without the DeepStack features
// differs, so that a member that lost them would fail. Only the prompts
// whose split falls inside the image are run.
Prompt SplitInsideImage(const std::string& model, int words, int middle) {
  const std::vector<worker::MediaEmbedding> images = Encode(model, 2);
  auto tok = model::Tokenizer::FromFile(ModelDir(model) + "/tokenizer.json").value();
  const int32_t pad = model::LoadModelConfig(ModelDir(model)).value().tokens.image_pad;
  for (int head = 10; head < words - middle - 2; ++head) {
    const Prompt p = MakePrompt(head, middle, words - head - middle, /*again=*/true);
    const std::vector<int32_t> ids = tok->Encode(p.text).value();
    std::vector<int> pads;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] == pad) pads.push_back(static_cast<int>(i));
    }
    REQUIRE(pads.size() == 4);
    const int first = static_cast<int>(images[0].grid.num_tokens());
    const int second = static_cast<int>(images[1].grid.num_tokens());
    const int len = static_cast<int>(ids.size()) - 4 + 2 * (first + second);
    const int begin = pads[1] - 1 + first;  // the second image's first row
    if (begin < len / 2 && len / 2 < begin + second &&
        InProcess(model, p, /*deepstack=*/false) != InProcess(model, p)) {
      return p;
    }
  }
  FAIL("no head length puts the split inside the image with an answer the features change");
  return {};
}

// An image then a video (the clip at the processor's default 2 fps), with
// `head` words before them and `tail` words after.
mmserve::v1::GenerateRequest VideoRequest(int head = 0, int tail = 0) {
  Prompt p;
  p.images = 1;
  p.text = absl::StrCat(
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nLook",
      Words(head, 0), kImage, " then", kVideo, Words(tail, head),
      " What moves?<|im_end|>\n<|im_start|>assistant\n");
  mmserve::v1::GenerateRequest r = Request(p);
  r.mutable_raw()->add_videos()->set_data(ReadFileToString(RunfilesRoot() + kClip).value());
  return r;
}

// The clip of `r` as the encoder samples it, and its temporal patches'
// timestamps as the router reads them from the header.
struct SampledVideo {
  model::ImagePatches patches;
  std::vector<double> stamps;
};

SampledVideo Sample(const mmserve::v1::GenerateRequest& r, const model::ModelConfig& config) {
  const mmserve::v1::Video& video = r.raw().videos(0);
  SampledVideo v;
  v.stamps =
      model::VideoTimestampsFromHeaders(video, *config.preprocessor, model::VideoLimits()).value();
  v.patches =
      model::LoadVideo(video, *config.preprocessor, model::VideoLimits(), model::DecodeLimits())
          .value();
  REQUIRE(static_cast<int64_t>(v.stamps.size()) == v.patches.grid.grid_t);
  return v;
}

// The in-process engine's tokens for a VideoRequest: the prompt with each
// temporal patch after its timestamp, the image's and the video's rows from
// the checkpoint's tower; with `deepstack` false, every DeepStack feature
// zero.
std::vector<int32_t> InProcessVideo(const std::string& model, const mmserve::v1::GenerateRequest& r,
                                    bool deepstack = true) {
  const std::string dir = ModelDir(model);
  const model::ModelConfig config = model::LoadModelConfig(dir).value();
  const SampledVideo v = Sample(r, config);
  worker::EngineRequest req;
  req.id = "reference";
  req.prompt = model::ExpandQwen3VideoPrompt(r.raw().text(), {{v.stamps, 1}}).value();
  req.image_embeddings = Encode(model, 1);
  auto ckpt = model::SafetensorsCheckpoint::Open(dir).value();
  auto tower = model::VisionTower::Load(*ckpt, config).value();
  worker::MediaEmbedding e;
  e.grid = v.patches.grid;
  e.values = model::TokenRows(
      tower->ForwardAll(v.patches.values, std::vector<model::MediaGrid>{v.patches.grid}).value(),
      config.text.hidden_size);
  req.image_embeddings.push_back(std::move(e));
  if (!deepstack) DropDeepstack(model, req.image_embeddings);
  absl::StatusOr<std::vector<int32_t>> ids = InProcessGreedy(dir, std::move(req), kMaxTokens);
  INFO(ids.status());
  REQUIRE(ids.ok());
  return *std::move(ids);
}

// A VideoRequest of about `words` words whose expanded token row len / 2
// (where a degree-2 group splits its rows) falls inside a temporal patch of
// the video, not on its first row: the patches' timestamps and rows, with
// their DeepStack features, lie on both members; and whose answer without
// the features differs, so that a member that lost them would fail.
mmserve::v1::GenerateRequest SplitInsideVideo(int words) {
  const std::string dir = ModelDir(kDense);
  const model::ModelConfig config = model::LoadModelConfig(dir).value();
  auto tok = model::Tokenizer::FromFile(dir + "/tokenizer.json").value();
  const int64_t image_rows = Encode(kDense, 1)[0].grid.num_tokens();
  // A word is several of the tiny tokenizer's tokens, more than a patch's
  // rows: vary where the video is and, by the tail, where the middle is.
  for (int head = 10; head < words - 10; ++head) {
    for (int tail = words - head; tail < words - head + 4; ++tail) {
      mmserve::v1::GenerateRequest r = VideoRequest(head, tail);
      // All 21 frames at full size: ten temporal patches of 3 x 2 rows.
      r.mutable_raw()->mutable_videos(0)->set_fps(10);
      r.mutable_raw()->mutable_videos(0)->set_max_pixels(96 * 64 * 22);
      const SampledVideo v = Sample(r, config);
      const int64_t patch_rows = v.patches.grid.num_tokens() / v.patches.grid.grid_t;
      REQUIRE(patch_rows >= 2);
      const std::vector<int32_t> ids =
          tok->Encode(model::ExpandQwen3VideoPrompt(r.raw().text(), {{v.stamps, 1}}).value())
              .value();
      const int64_t len = static_cast<int64_t>(ids.size()) + (image_rows - 1) +
                          v.patches.grid.grid_t * (patch_rows - 1);
      int64_t row = 0;
      for (int32_t id : ids) {
        if (id == config.tokens.video_pad && row < len / 2 && len / 2 < row + patch_rows &&
            InProcessVideo(kDense, r, /*deepstack=*/false) != InProcessVideo(kDense, r)) {
          return r;
        }
        row += id == config.tokens.image_pad   ? image_rows
               : id == config.tokens.video_pad ? patch_rows
                                               : 1;
      }
    }
  }
  FAIL("no head length puts the split inside the video");
  return {};
}

enum class Topology { kBoth, kBothTp, kPd, kElastic };

struct Case {
  const char* model;
  const char* name;
  Topology topology;
  const char* profile;
};

launcher::StackOptions StackFor(const Case& c) {
  launcher::StackOptions o = TestStackOptions(1, c.profile);
  o.model_dir = ModelDir(c.model);
  switch (c.topology) {
    case Topology::kBoth:
      // Chunks of 5 rows: both images (9 and 4 rows) span chunk boundaries.
      o.language_args = {"--max_prefill_tokens=5"};
      break;
    case Topology::kBothTp:
      // Rank 1 reads each image row and its features from the shared
      // receive buffer by offset.
      o.language_args = {"--tp=2", "--mm_handoff=async"};
      break;
    case Topology::kPd:
      o.prefill = 1;
      o.decode = 1;
      o.language_args = {"--max_prefill_tokens=5"};
      o.decode_args = {"--tp=2"};
      break;
    case Topology::kElastic:
      o.language_args = {"--kv_cache_mb=1", "--threads=1"};
      UseElasticPair(o);
      break;
  }
  return o;
}

TEST_CASE("Qwen3-VL and Qwen3-VL-MoE with DeepStack through the stack give the engine's tokens") {
  // Pools are 1 MiB: about 680 tokens of these checkpoints' KV (3 layers of
  // 2 KV heads of 32, fp32), a group of two 1360; the elastic prompts (two
  // images twice in about 720 and 800 tokens, or an image and a video) need
  // a group.
  const Prompt short_prompt = MakePrompt(20, 10, 10);
  // With 250 words and 10 between the images the MoE's answer is the same
  // without the features; 282 words and 16 give one they change.
  const Prompt long_prompt = SplitInsideImage(kDense, 250, 10);
  const Prompt long_moe_prompt = SplitInsideImage(kMoe, 282, 16);
  const mmserve::v1::GenerateRequest long_video = SplitInsideVideo(250);
  const std::vector<Case> cases = {
      {kDense, "role both", Topology::kBoth, "shm"},
      {kDense, "role both --tp=2", Topology::kBothTp, "shm"},
      {kDense, "prefill + decode --tp=2", Topology::kPd, "tcp"},
      {kDense, "elastic degree-2 group", Topology::kElastic, "shm"},
      {kMoe, "role both", Topology::kBoth, "tcp"},
      {kMoe, "prefill + decode --tp=2", Topology::kPd, "shm"},
      {kMoe, "elastic degree-2 group", Topology::kElastic, "tcp"},
  };
  for (const Case& c : cases) {
    INFO(c.model << ", " << c.name << ", " << c.profile);
    const Prompt& p = c.topology != Topology::kElastic ? short_prompt
                      : std::string(c.model) == kMoe   ? long_moe_prompt
                                                       : long_prompt;
    const std::vector<int32_t> want = InProcess(c.model, p);
    // The features change the answer: a stack that lost them would fail.
    REQUIRE(InProcess(c.model, p, /*deepstack=*/false) != want);
    auto stack = launcher::LocalStack::Start(StackFor(c));
    INFO(stack.status().ToString());
    REQUIRE(stack.ok());
    auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
    const Answer a = AskGrpc(*stub, Request(p), {});
    INFO(a.status.ToString());
    REQUIRE(a.status.ok());
    CHECK(a.token_ids == want);
    if (c.topology == Topology::kBothTp) {
      // All 13 image rows went to rank 1 as offsets, features included.
      CHECK(ScrapeMetric((*stack)->language().metrics_port(), "mmserve_language_mm_rows_total",
                         "placement=\"descriptor\"") == 13);
    }
    if (c.topology == Topology::kElastic) {
      CHECK(ScrapeMetric((*stack)->router().metrics_port(), "mmserve_router_elastic_requests_total",
                         "degree=\"2\"") == 1);
    }
    if (c.topology != Topology::kBothTp) {
      // The elastic stack's video is long enough to need the group.
      const mmserve::v1::GenerateRequest video =
          c.topology == Topology::kElastic ? long_video : VideoRequest();
      const Answer v = AskGrpc(*stub, video, {});
      if (std::string(c.model) == kMoe) {
        // No Qwen3-VL video processor config: refused before any work.
        CHECK(v.status.code() == absl::StatusCode::kInvalidArgument);
        CHECK(v.status.message().find("Qwen3-VL video processor") != std::string::npos);
      } else {
        INFO(v.status.ToString());
        REQUIRE(v.status.ok());
        CHECK(v.token_ids == InProcessVideo(c.model, video));
        if (c.topology == Topology::kElastic) {
          CHECK(ScrapeMetric((*stack)->router().metrics_port(),
                             "mmserve_router_elastic_requests_total", "degree=\"2\"") == 2);
        }
      }
    }
    const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(5));
    INFO(leaks.ToString());
    CHECK(leaks.zero());
  }
}

}  // namespace
}  // namespace mmserve::testing
