// Videos through the encoder core to a receiving transfer engine in the same
// process: a video over the patch budget runs in several tower batches and
// its rows equal one tower call on the same patches; the receiver's default
// allocation is too small, so the transfer resumes; the grid travels in the
// M-RoPE section; a second request hits the cache (the key includes the
// sampling options); hostile videos end the job with INVALID_ARGUMENT. A
// Qwen3-VL image's rows carry its DeepStack features after its embedding.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/file.h"
#include "common/metrics.h"
#include "encoder_service/encoder_core.h"
#include "model/image_decode.h"
#include "model/image_preprocess.h"
#include "model/safetensors.h"
#include "model/video_request.h"
#include "model/vision_tower.h"
#include "transfer/embedding_layout.h"
#include "transfer/transfer_engine.h"

namespace mmserve::encoder {
namespace {

constexpr char kModel[] = "model/testdata/models/qwen2vl-tiny-mha-tied";

struct Rig {
  model::ModelConfig config;
  metrics::Registry registry;
  std::unique_ptr<transfer::TransferEngine> enc, lang;
  std::unique_ptr<EncoderCore> core;
};

std::unique_ptr<Rig> MakeRig(int64_t max_batch_patches) {
  auto rig = std::make_unique<Rig>();
  auto config = model::LoadModelConfig(kModel);
  REQUIRE(config.ok());
  rig->config = *config;
  transfer::EmbeddingLayout layout{.block_size = 16,
                                   .num_blocks = 64,
                                   .hidden_size = static_cast<uint32_t>(config->text.hidden_size),
                                   .dtype_bytes = sizeof(float)};
  auto enc = transfer::TransferEngine::Create({.instance_id = "enc", .layout = layout});
  REQUIRE(enc.ok());
  auto lang = transfer::TransferEngine::Create(
      {.instance_id = "lang", .layout = layout, .default_num_blocks = 2});
  REQUIRE(lang.ok());
  rig->enc = std::move(*enc);
  rig->lang = std::move(*lang);
  REQUIRE(rig->enc->Connect(rig->lang->local_info()).ok());
  REQUIRE(rig->lang->Connect(rig->enc->local_info()).ok());
  EncoderCoreOptions options;
  options.model_dir = kModel;
  options.max_batch_patches = max_batch_patches;
  auto core = EncoderCore::Create(options, *rig->enc, rig->registry);
  REQUIRE(core.ok());
  rig->core = std::move(*core);
  return rig;
}

std::shared_ptr<mmserve::v1::Video> Clip(const std::string& name) {
  auto bytes = ReadFileToString("model/testdata/video/clips/" + name);
  REQUIRE(bytes.ok());
  auto v = std::make_shared<mmserve::v1::Video>();
  v->set_data(*bytes);
  return v;
}

absl::StatusOr<v1::EncodeResponse> Encode(EncoderCore& core, const std::string& id,
                                          std::shared_ptr<const mmserve::v1::Video> video,
                                          ContentHash hash) {
  EncodeJob job{.request_id = id, .transfer_id = id};
  job.images.push_back({.image_index = 0, .data = "", .hash = hash, .video = std::move(video)});
  std::promise<absl::StatusOr<v1::EncodeResponse>> done;
  core.Encode(std::move(job),
              [&done](absl::StatusOr<v1::EncodeResponse> r) { done.set_value(std::move(r)); });
  return done.get_future().get();
}

absl::StatusOr<transfer::ReceivedMedia> Receive(transfer::TransferEngine& lang,
                                                const std::string& id) {
  std::promise<absl::StatusOr<transfer::ReceivedMedia>> got;
  lang.Receive({.request_id = id, .sender = "enc"},
               [&got](absl::StatusOr<transfer::ReceivedMedia> r) { got.set_value(std::move(r)); });
  return got.get_future().get();
}

TEST_CASE("a long video is split across tower batches, resumes and equals one tower call") {
  // All 21 frames: grid (11, 4, 6), 264 patches in batches of at most 48
  // (two temporal patches), 66 tokens against a default allocation of 32.
  auto rig = MakeRig(48);
  const auto video = Clip("h264_96x64_21f.mp4");
  const ContentHash key = model::VideoContentHash(*video);
  auto r = Encode(*rig->core, "r1", video, key);
  REQUIRE(r.ok());
  REQUIRE(r->images_size() == 1);
  CHECK(r->images(0).grid_t() == 11);
  CHECK(r->images(0).num_tokens() == 66);
  CHECK_FALSE(r->images(0).cache_hit());
  // 11 temporal patches, at most 2 per batch.
  CHECK(absl::StrContains(rig->registry.Render(), "mmserve_encoder_tower_seconds_count 6\n"));
  auto got = Receive(*rig->lang, "r1");
  REQUIRE(got.ok());
  CHECK(got->num_chunks() > 1);  // resumed past the default allocation
  REQUIRE(got->total_tokens() == 66);
  auto grid = transfer::DecodeImageGrid(got->Section(transfer::kMrope), 66);
  REQUIRE(grid.ok());
  CHECK(*grid == transfer::MediaTokenGrid{.t = 11, .rows = 2, .cols = 3});

  // The reference: the whole video in one tower call.
  auto patches = model::LoadVideo(*video, *rig->config.preprocessor, model::VideoLimits(),
                                  model::DecodeLimits());
  REQUIRE(patches.ok());
  auto ckpt = model::SafetensorsCheckpoint::Open(kModel);
  REQUIRE(ckpt.ok());
  auto tower = model::VisionTower::Load(**ckpt, rig->config);
  REQUIRE(tower.ok());
  auto want = (*tower)->Forward(patches->values, std::vector<model::MediaGrid>{patches->grid});
  REQUIRE(want.ok());
  const std::string emb = got->Section(transfer::kEmbedding);
  REQUIRE(emb.size() == want->size() * sizeof(float));
  std::vector<float> have(want->size());
  std::memcpy(have.data(), emb.data(), emb.size());
  float worst = 0;
  for (size_t i = 0; i < have.size(); ++i) worst = std::max(worst, std::fabs(have[i] - (*want)[i]));
  CHECK(worst < 1e-5f);
  got->Release();

  // The same clip again: a cache hit; sampled differently: a new key.
  auto again = Encode(*rig->core, "r2", video, key);
  REQUIRE(again.ok());
  CHECK(again->images(0).cache_hit());
  REQUIRE(Receive(*rig->lang, "r2").ok());
  auto sampled = std::make_shared<mmserve::v1::Video>(*video);
  sampled->set_fps(2.0);
  auto other = Encode(*rig->core, "r3", sampled, model::VideoContentHash(*sampled));
  REQUIRE(other.ok());
  CHECK_FALSE(other->images(0).cache_hit());
  CHECK(other->images(0).grid_t() == 2);
  REQUIRE(Receive(*rig->lang, "r3").ok());
}

TEST_CASE("hostile videos end the job with INVALID_ARGUMENT and the reason") {
  auto rig = MakeRig(16384);
  const auto video = Clip("h264_96x64_21f.mp4");
  auto wrong = Encode(*rig->core, "w", video, ContentHash{1, 2});
  CHECK(absl::IsInvalidArgument(wrong.status()));
  CHECK(absl::StrContains(wrong.status().message(), "video 0: content hash"));
  for (const char* clip : {"zero_frames.avi", "ffv1_32x32.mkv", "hours.mp4"}) {
    const auto bad = Clip(clip);
    auto r = Encode(*rig->core, clip, bad, model::VideoContentHash(*bad));
    INFO(clip << ": " << r.status());
    CHECK(absl::IsInvalidArgument(r.status()));
    CHECK(absl::StartsWith(r.status().message(), "video 0: "));
  }
  CHECK(rig->enc->allocator().used_blocks() == 0);
}

constexpr char kQwen3Vl[] = "model/testdata/models/qwen3vl-tiny";

transfer::EmbeddingLayout RowsOf(uint32_t width) {
  return {.block_size = 16, .num_blocks = 64, .hidden_size = width, .dtype_bytes = sizeof(float)};
}

TEST_CASE("a Qwen3-VL image travels as its main embedding and DeepStack sections", "[encoder]") {
  auto config = model::LoadModelConfig(kQwen3Vl);
  REQUIRE(config.ok());
  REQUIRE(config->DeepstackLevels() == 2);
  const uint32_t hidden = static_cast<uint32_t>(config->text.hidden_size);
  metrics::Registry registry;
  EncoderCoreOptions options;
  options.model_dir = kQwen3Vl;
  {
    // A buffer of the main embedding's width has no room for the features.
    auto narrow =
        transfer::TransferEngine::Create({.instance_id = "enc", .layout = RowsOf(hidden)});
    REQUIRE(narrow.ok());
    auto core = EncoderCore::Create(options, **narrow, registry);
    REQUIRE_FALSE(core.ok());
    CHECK(absl::IsInvalidArgument(core.status()));
  }
  const uint32_t width = static_cast<uint32_t>(config->EmbeddingRowWidth());
  REQUIRE(width == 3 * hidden);
  auto enc = transfer::TransferEngine::Create({.instance_id = "enc", .layout = RowsOf(width)});
  auto lang = transfer::TransferEngine::Create(
      {.instance_id = "lang", .layout = RowsOf(width), .default_num_blocks = 1});
  REQUIRE((enc.ok() && lang.ok()));
  REQUIRE((*enc)->Connect((*lang)->local_info()).ok());
  REQUIRE((*lang)->Connect((*enc)->local_info()).ok());
  auto core = EncoderCore::Create(options, **enc, registry);
  INFO(core.status());
  REQUIRE(core.ok());
  CHECK((*core)->hidden_size() == static_cast<int>(width));

  auto bytes = ReadFileToString("model/testdata/images/gray.png");  // 64 x 48
  REQUIRE(bytes.ok());
  EncodeJob job{.request_id = "q", .transfer_id = "q"};
  job.images.push_back({.image_index = 0, .data = *bytes, .hash = HashBytes(*bytes)});
  std::promise<absl::StatusOr<v1::EncodeResponse>> done;
  (*core)->Encode(std::move(job),
                  [&done](absl::StatusOr<v1::EncodeResponse> r) { done.set_value(std::move(r)); });
  auto r = done.get_future().get();
  REQUIRE(r.ok());
  auto got = Receive(**lang, "q");
  REQUIRE(got.ok());
  const uint32_t n = got->total_tokens();
  REQUIRE(n == r->images(0).num_tokens());
  auto sections = transfer::DecodeImageSections(got->Section(transfer::kAux), n, width);
  REQUIRE(sections.ok());
  CHECK(*sections == transfer::EmbeddingSections{.version = 2, .count = 3, .width = hidden});

  // The reference: the tower's outputs on the same patches, row by row.
  auto image = model::DecodeImage(*bytes, model::DecodeLimits());
  REQUIRE(image.ok());
  auto patches = model::PreprocessImage(*image, *config->preprocessor);
  REQUIRE(patches.ok());
  auto ckpt = model::SafetensorsCheckpoint::Open(kQwen3Vl);
  REQUIRE(ckpt.ok());
  auto tower = model::VisionTower::Load(**ckpt, *config);
  REQUIRE(tower.ok());
  auto want = (*tower)->ForwardAll(patches->values, std::vector<model::MediaGrid>{patches->grid});
  REQUIRE(want.ok());
  REQUIRE(want->deepstack.size() == 2);
  const std::string emb = got->Section(transfer::kEmbedding);
  REQUIRE(emb.size() == size_t{n} * width * sizeof(float));
  std::vector<float> rows(size_t{n} * width);
  std::memcpy(rows.data(), emb.data(), emb.size());
  float worst = 0;
  for (uint32_t t = 0; t < n; ++t) {
    for (uint32_t i = 0; i < hidden; ++i) {
      const float* row = &rows[size_t{t} * width];
      worst = std::max(worst, std::fabs(row[i] - want->main[t * hidden + i]));
      for (int k = 0; k < 2; ++k) {
        worst = std::max(worst,
                         std::fabs(row[(1 + k) * hidden + i] - want->deepstack[k][t * hidden + i]));
      }
    }
  }
  CHECK(worst < 1e-5f);
  got->Release();
  (*core)->Shutdown();
}

}  // namespace
}  // namespace mmserve::encoder
