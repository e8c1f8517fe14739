#include "fuzz/router_request_check.h"

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fuzz/fuzz_check.h"
#include "model/image_decode.h"
#include "model/image_preprocess.h"
#include "model/model_config.h"
#include "model/video_request.h"
#include "router/request_media.h"

namespace mmserve::fuzz {
namespace {

using Prepared = absl::StatusOr<std::vector<router::PreparedMedia>>;

constexpr char kModelDir[] = "model/testdata/models/qwen2vl-tiny-mha-tied";

bool SameGrid(const model::MediaGrid& a, const model::MediaGrid& b) {
  return a.resized_height == b.resized_height && a.resized_width == b.resized_width &&
         a.grid_t == b.grid_t && a.grid_h == b.grid_h && a.grid_w == b.grid_w &&
         a.merge_size == b.merge_size;
}

void CheckSame(const Prepared& a, const Prepared& b, const char* what) {
  FUZZ_CHECK(a.status() == b.status()) << what << ": " << a.status() << " vs " << b.status();
  if (!a.ok()) return;
  FUZZ_CHECK(a->size() == b->size()) << what;
  for (size_t k = 0; k < a->size(); ++k) {
    FUZZ_CHECK((*a)[k].hash == (*b)[k].hash) << what << ": image " << k;
    FUZZ_CHECK((*a)[k].grid.has_value() == (*b)[k].grid.has_value()) << what << ": image " << k;
    if ((*a)[k].grid) {
      FUZZ_CHECK(SameGrid(*(*a)[k].grid, *(*b)[k].grid)) << what << ": image " << k;
    }
  }
}

}  // namespace

const router::RouterOptions& FuzzRouterOptions() {
  static const router::RouterOptions* options = [] {
    absl::StatusOr<model::ModelConfig> config = model::LoadModelConfig(kModelDir);
    FUZZ_CHECK(config.ok()) << config.status() << " (run from the workspace root)";
    FUZZ_CHECK(config->vision && config->preprocessor) << kModelDir << " is not a vision model";
    auto* o = new router::RouterOptions();
    o->model_id = "qwen2vl-tiny";
    o->config = *config;
    o->max_image_pixels = int64_t{1} << 20;
    return o;
  }();
  return *options;
}

absl::Status CheckPrepareRequest(const router::RouterOptions& options,
                                 const mmserve::v1::GenerateRequest& request) {
  const Prepared prepared = router::PrepareRequest(options, request);
  if (!prepared.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(prepared.status())) << prepared.status();
    FUZZ_CHECK(!prepared.status().message().empty());
  }
  CheckSame(prepared, router::PrepareRequest(options, request), "second call");

  mmserve::v1::GenerateRequest wire;
  FUZZ_CHECK(wire.ParseFromString(request.SerializeAsString()));
  CheckSame(prepared, router::PrepareRequest(options, wire), "after a wire round trip");

  const absl::Status validated = router::ValidateRequest(options, request);
  if (!validated.ok()) FUZZ_CHECK(prepared.status() == validated) << prepared.status();
  if (prepared.ok()) FUZZ_CHECK(validated.ok()) << validated;

  router::RouterOptions unsized = options;
  unsized.presize = false;
  const Prepared plain = router::PrepareRequest(unsized, request);
  FUZZ_CHECK(plain.status() == validated) << plain.status() << " vs " << validated;
  if (plain.ok()) {
    for (const router::PreparedMedia& im : *plain) FUZZ_CHECK(!im.grid.has_value());
  }
  if (!prepared.ok()) return prepared.status();

  const std::vector<router::MediaPart> media = router::RequestMedia(request);
  FUZZ_CHECK(prepared->size() == media.size()) << prepared->size() << " vs " << media.size();
  FUZZ_CHECK(plain->size() == media.size());
  model::DecodeLimits limits;
  limits.max_pixels = options.max_image_pixels;
  limits.max_bytes = static_cast<int64_t>(options.max_image_bytes);
  for (size_t k = 0; k < media.size(); ++k) {
    const router::PreparedMedia& im = (*prepared)[k];
    FUZZ_CHECK((*plain)[k].hash == im.hash) << "media " << k;
    FUZZ_CHECK(im.grid.has_value()) << "media " << k << " accepted without a grid";
    FUZZ_CHECK(im.grid->num_tokens() > 0) << "media " << k;
    absl::StatusOr<model::ImagePatches> patches;
    if (media[k].video != nullptr) {
      FUZZ_CHECK(im.video && im.hash == model::VideoContentHash(*media[k].video)) << "video " << k;
      // What the encoder does with the video (encoder_core.cc).
      patches = model::LoadVideo(*media[k].video, *options.config.preprocessor,
                                 options.video_limits, limits);
    } else {
      FUZZ_CHECK(!im.video && im.hash == HashBytes(media[k].image->data())) << "image " << k;
      absl::StatusOr<model::RgbImage> rgb = model::DecodeImage(media[k].image->data(), limits);
      if (!rgb.ok()) {
        FUZZ_CHECK(absl::IsInvalidArgument(rgb.status())) << rgb.status();
        continue;
      }
      patches = model::PreprocessImage(*rgb, *options.config.preprocessor);
      FUZZ_CHECK(patches.ok()) << "image " << k
                               << ": the router sized it, preprocessing refused it: "
                               << patches.status();
    }
    if (!patches.ok()) {  // a video whose frames do not decode
      FUZZ_CHECK(absl::IsInvalidArgument(patches.status())) << patches.status();
      continue;
    }
    FUZZ_CHECK(SameGrid(patches->grid, *im.grid))
        << "media " << k << ": header grid " << im.grid->grid_t << "x" << im.grid->grid_h << "x"
        << im.grid->grid_w << " (" << im.grid->num_tokens() << " tokens), decoded "
        << patches->grid.grid_t << "x" << patches->grid.grid_h << "x" << patches->grid.grid_w
        << " (" << patches->grid.num_tokens() << " tokens)";
  }
  return absl::OkStatus();
}

}  // namespace mmserve::fuzz
