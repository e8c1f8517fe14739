// Videos through the whole stack (router, encoder, language as separate
// processes, real gRPC and UCX) against the in-process engine on the demo
// model: a question on a clip and a question on a clip and an image, over
// gRPC and over the OpenAI HTTP API (video_url data: URL), on the shm and tcp
// profiles and through prefill/decode disaggregation; a video whose
// embedding exceeds the receiver's default allocation resumes and is still
// equal; a video request cancelled while its embedding is in flight frees
// every block on every process.
#include <httplib.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/file.h"
#include "common/grpc_server.h"
#include "model/chat_template.h"
#include "model/image_decode.h"
#include "model/image_preprocess.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/video_request.h"
#include "model/vision_tower.h"
#include "tests/stack_harness.h"
#include "worker/engine.h"

namespace mmserve::testing {
namespace {

constexpr char kClip[] = "h264_96x64_21f.mp4";  // 21 frames: 11 x 4 x 6 patches, 66 tokens
constexpr char kQuestion[] = "What is in the video?";

std::string ClipBytes() {
  return ReadFileToString(RunfilesRoot() + "/model/testdata/video/clips/" + kClip).value();
}

// One case: a user message of a video (the clip), optionally the first demo
// image after it, then the question.
struct VideoCase {
  bool with_image = false;
};

std::string ImageBytes() {
  const DemoSet& set = Demo();
  return set.images.at(set.items[0].image_file);
}

mmserve::v1::GenerateRequest VideoRequest(const VideoCase& c) {
  mmserve::v1::GenerateRequest req;
  auto* msg = req.mutable_chat()->add_messages();
  msg->set_role("user");
  msg->add_content()->mutable_video()->set_data(ClipBytes());
  if (c.with_image) msg->add_content()->mutable_image()->set_data(ImageBytes());
  msg->add_content()->set_text(kQuestion);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(8);
  req.mutable_stream()->set_include_token_ids(true);
  return req;
}

// The in-process engine's greedy answer: the clip preprocessed and encoded
// by the demo model's tower here, the prompt rendered by the chat template.
Answer InProcessVideo(const VideoCase& c) {
  const std::string dir = DemoModelDir();
  const model::ModelConfig config = model::LoadModelConfig(dir).value();
  auto ckpt = model::SafetensorsCheckpoint::Open(dir).value();
  auto tower = model::VisionTower::Load(*ckpt, config).value();
  mmserve::v1::Video video;
  video.set_data(ClipBytes());
  std::vector<model::ImagePatches> media;
  media.push_back(
      model::LoadVideo(video, *config.preprocessor, model::VideoLimits(), model::DecodeLimits())
          .value());
  std::vector<model::ChatPart> parts = {{model::ChatPart::Kind::kVideo, ""}};
  if (c.with_image) {
    const model::RgbImage rgb = model::DecodeImage(ImageBytes(), model::DecodeLimits()).value();
    media.push_back(model::PreprocessImage(rgb, *config.preprocessor).value());
    parts.push_back({model::ChatPart::Kind::kImage, ""});
  }
  parts.push_back({model::ChatPart::Kind::kText, kQuestion});
  worker::EngineRequest req;
  req.id = "video";
  req.prompt = model::RenderQwen2VlChat({{"user", parts}}, model::ChatOptions()).value();
  for (const model::ImagePatches& p : media) {
    worker::MediaEmbedding e;
    e.grid = p.grid;
    e.values = tower->Forward(p.values, std::vector<model::MediaGrid>{p.grid}).value();
    req.image_embeddings.push_back(std::move(e));
  }
  REQUIRE(req.image_embeddings[0].grid.kind == model::MediaKind::kVideo);
  req.sampling.temperature = 0;
  req.sampling.max_tokens = 8;
  worker::EngineOptions o;
  o.model_dir = dir;
  o.kv_cache_bytes = 64ll << 20;
  auto engine = worker::LlmEngine::Create(o).value();
  Answer a;
  REQUIRE((engine->AddRequest(std::move(req), [&a](const worker::StreamEvent& e) {
            a.text += e.text;
            a.token_ids.insert(a.token_ids.end(), e.token_ids.begin(), e.token_ids.end());
          })).ok());
  while (engine->has_unfinished()) REQUIRE(engine->Step().ok());
  return a;
}

const Answer& Reference(const VideoCase& c) {
  static const Answer* video = new Answer(InProcessVideo({.with_image = false}));
  static const Answer* video_image = new Answer(InProcessVideo({.with_image = true}));
  return c.with_image ? *video_image : *video;
}

// POST /v1/chat/completions with the clip as a video_url data: URL.
Answer AskHttpVideo(int port, const VideoCase& c) {
  nlohmann::json content = nlohmann::json::array(
      {{{"type", "video_url"},
        {"video_url", {{"url", "data:video/mp4;base64," + absl::Base64Escape(ClipBytes())}}}}});
  if (c.with_image) {
    content.push_back(
        {{"type", "image_url"},
         {"image_url", {{"url", "data:image/png;base64," + absl::Base64Escape(ImageBytes())}}}});
  }
  content.push_back({{"type", "text"}, {"text", kQuestion}});
  nlohmann::json body;
  body["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", content}}});
  body["temperature"] = 0;
  body["max_tokens"] = 8;
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  Answer a;
  auto res = cli.Post("/v1/chat/completions", body.dump(), "application/json");
  if (!res || res->status != 200) {
    a.status = absl::UnknownError(res ? absl::StrCat("HTTP ", res->status, ": ", res->body)
                                      : std::string("no HTTP response"));
    return a;
  }
  a.text = nlohmann::json::parse(res->body)["choices"][0]["message"]["content"];
  return a;
}

void CheckGrpcEqual(launcher::LocalStack& stack) {
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel(stack.router_address()));
  for (const bool with_image : {false, true}) {
    INFO("with an image: " << with_image);
    const Answer a = AskGrpc(*stub, VideoRequest({.with_image = with_image}), {});
    REQUIRE(a.status.ok());
    CHECK(a.token_ids == Reference({.with_image = with_image}).token_ids);
    CHECK(a.text == Reference({.with_image = with_image}).text);
  }
}

void CheckNoLeaks(launcher::LocalStack& stack) {
  const Leaks leaks = WaitForNoLeaks(stack, absl::Seconds(10));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
}

TEST_CASE("video questions over gRPC and HTTP (shm) equal the in-process engine") {
  REQUIRE(!Reference({}).token_ids.empty());
  auto stack = launcher::LocalStack::Start(TestStackOptions(1, "shm"));
  REQUIRE(stack.ok());
  CheckGrpcEqual(**stack);
  for (const bool with_image : {false, true}) {
    INFO("HTTP, with an image: " << with_image);
    const Answer a = AskHttpVideo((*stack)->http_port(), {.with_image = with_image});
    INFO(a.status);
    REQUIRE(a.status.ok());
    CHECK(a.text == Reference({.with_image = with_image}).text);
  }
  const int port = (*stack)->language().metrics_port();
  CHECK(ScrapeMetric(port, "mmserve_language_resumes_total") == 0);  // pre-sized exactly
  CheckNoLeaks(**stack);
}

TEST_CASE("video questions over gRPC and HTTP (tcp) equal the in-process engine") {
  auto stack = launcher::LocalStack::Start(TestStackOptions(1, "tcp"));
  REQUIRE(stack.ok());
  CheckGrpcEqual(**stack);
  const Answer a = AskHttpVideo((*stack)->http_port(), {.with_image = true});
  INFO(a.status);
  REQUIRE(a.status.ok());
  CHECK(a.text == Reference({.with_image = true}).text);
  CheckNoLeaks(**stack);
}

TEST_CASE("video questions through prefill/decode disaggregation equal the in-process engine") {
  launcher::StackOptions o = TestStackOptions(1, "shm");
  o.prefill = 1;
  o.decode = 1;
  auto stack = launcher::LocalStack::Start(o);
  REQUIRE(stack.ok());
  CheckGrpcEqual(**stack);  // the video's spans and M-RoPE delta handed over
  CheckNoLeaks(**stack);
}

TEST_CASE(
    "a video past the default allocation resumes and is still equal; cancelled in flight, it "
    "frees every block") {
  // The clip's 66 tokens arrive as 4, then a resume for the other 62.
  launcher::StackOptions o = ResumeStackOptions();
  o.encoder_args.push_back("--test_only_publish_delay_ms=1500");
  auto stack = launcher::LocalStack::Start(o);
  REQUIRE(stack.ok());
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  const Answer a = AskGrpc(*stub, VideoRequest({}), {});
  REQUIRE(a.status.ok());
  CHECK(a.token_ids == Reference({}).token_ids);
  const int port = (*stack)->language().metrics_port();
  CHECK(ScrapeMetric(port, "mmserve_language_resumes_total") >= 1);
  CheckNoLeaks(**stack);

  // A clip sampled differently (a new cache key, so the tower runs again),
  // cancelled while the encoder holds its embedding before publishing.
  mmserve::v1::GenerateRequest other = VideoRequest({});
  other.mutable_chat()->mutable_messages(0)->mutable_content(0)->mutable_video()->set_fps(5.0);
  AskOptions cancel;
  cancel.deadline = absl::Milliseconds(1000);
  std::atomic<bool> held{false};
  std::thread watcher([&] {
    // The language instance holds the request, waiting for the embedding.
    const Deadline d = Deadline::After(absl::Seconds(5));
    while (!held && !d.Expired()) {
      held = ScrapeMetric(port, "mmserve_language_requests_live") == 1;
      if (!held) absl::SleepFor(absl::Milliseconds(10));
    }
  });
  const Answer cancelled = AskGrpc(*stub, other, cancel);
  watcher.join();
  CHECK(held.load());
  CHECK(absl::IsDeadlineExceeded(cancelled.status));
  CheckNoLeaks(**stack);
  // Every process still serves the clip right.
  const Answer again = AskGrpc(*stub, VideoRequest({}), {});
  REQUIRE(again.status.ok());
  CHECK(again.token_ids == Reference({}).token_ids);
  CheckNoLeaks(**stack);
}

}  // namespace
}  // namespace mmserve::testing
