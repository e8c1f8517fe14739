// Request preparation without a model: token checks, image expansion and
// M-RoPE positions, hand-off image placement, max_tokens, the scheduler's
// parameters and the hand-off prompt.
#include "worker/request_prep.h"

#include <catch2/catch.hpp>
#include <vector>

namespace mmserve::worker {
namespace {

constexpr int32_t kPad = 9;
constexpr int kHidden = 2;

PromptRules Rules() {
  PromptRules r;
  r.vocab_size = 16;
  r.hidden_size = kHidden;
  r.image_pad_id = kPad;
  r.accepts_images = true;
  r.merge_size = 2;
  r.max_model_len = 32;
  r.eos_ids = {15, 14};
  return r;
}

TEST_CASE("token ids must be a non-empty prompt inside the vocabulary", "[request_prep]") {
  CHECK(CheckTokenIds({1, 2, 15}, 16).ok());
  CHECK(CheckTokenIds({}, 16).code() == absl::StatusCode::kInvalidArgument);
  CHECK(CheckTokenIds({1, 16}, 16).code() == absl::StatusCode::kInvalidArgument);
  CHECK(CheckTokenIds({-1}, 16).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("an image embedding must hold its grid's rows, or be shared with a key",
          "[request_prep]") {
  MediaEmbedding e;
  e.grid = model::MediaGrid::FromThw(1, 2, 4);  // 2 tokens
  e.values.assign(2 * kHidden, 0.5f);
  CHECK(CheckImageEmbedding(e, kHidden).ok());
  e.values.pop_back();
  CHECK(CheckImageEmbedding(e, kHidden).code() == absl::StatusCode::kInvalidArgument);
  MediaEmbedding shared;
  shared.grid = e.grid;
  const float rows[4] = {};
  shared.shared_values = rows;
  CHECK(CheckImageEmbedding(shared, kHidden).code() == absl::StatusCode::kInvalidArgument);
  shared.key = ContentHash{1, 2};
  CHECK(CheckImageEmbedding(shared, kHidden).ok());
}

TEST_CASE("each image pad expands into its run, with M-RoPE positions and spans",
          "[request_prep]") {
  const std::vector<float> a(2 * kHidden, 1.0f), b(2 * kHidden, 2.0f);
  std::vector<MediaRows> images = {
      {model::MediaGrid::FromThw(1, 2, 4), a, std::nullopt},
      {model::MediaGrid::FromThw(1, 2, 4), b, ContentHash{7, 8}},
  };
  auto p = ExpandImages({1, kPad, 2, kPad, 3}, images, Rules());
  REQUIRE(p.ok());
  CHECK(p->token_ids == std::vector<int32_t>{1, kPad, kPad, 2, kPad, kPad, 3});
  REQUIRE(p->images.size() == 2);
  CHECK(p->images[0].offset == 1);
  CHECK(p->images[0].length == 2);
  CHECK(p->images[0].rows == a.data());
  CHECK(p->images[0].rank_hash == 0);  // a hash of the rows, not sent to ranks
  CHECK(p->images[1].offset == 4);
  CHECK(p->images[1].key == ContentHash{7, 8});
  CHECK(p->images[1].rank_hash == 8);
  // Text 0; image t 1, h 1, w 1..2; text 3; image 4..5; text 6: the last
  // token at 6 sits at index 6, so delta 0; positions of the first image.
  CHECK(p->positions.t.size() == 7);
  CHECK(p->positions.w[1] == 1);
  CHECK(p->positions.w[2] == 2);
  // Equal pictures get equal keys, different ones different keys.
  auto again = ExpandImages({kPad}, {images[0]}, Rules());
  REQUIRE(again.ok());
  CHECK(again->images[0].key == p->images[0].key);
  std::vector<MediaRows> other = {{images[0].grid, b, std::nullopt}};
  auto differ = ExpandImages({kPad}, other, Rules());
  REQUIRE(differ.ok());
  CHECK_FALSE(differ->images[0].key == p->images[0].key);
  // A pad without an image, an image without a pad.
  CHECK(ExpandImages({1, kPad}, {}, Rules()).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ExpandImages({1}, {images[0]}, Rules()).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("hand-off images must lie on their runs of pads, in order", "[request_prep]") {
  const std::vector<int32_t> ids = {5, 6, kPad, kPad, kPad, kPad, kPad, kPad, 7};
  const std::vector<HandoffMedia> good = {{2, model::MediaGrid::FromThw(1, 4, 6), {1, 2}}};
  auto p = PlaceHandoffImages(ids, good, Rules());
  REQUIRE(p.ok());
  CHECK(p->token_ids == ids);
  REQUIRE(p->images.size() == 1);
  CHECK(p->images[0].rows == nullptr);
  CHECK(p->images[0].length == 6);
  // Text 0, 1; image t 2, h 2..3, w 2..4; text 5: next position 6 at index 9.
  CHECK(p->positions.delta == 6 - 9);
  auto bad = [&](HandoffMedia h) { return PlaceHandoffImages(ids, {h}, Rules()).status().code(); };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  CHECK(bad({1, model::MediaGrid::FromThw(1, 4, 6), {}}) == kInvalid);   // not on pads
  CHECK(bad({-4, model::MediaGrid::FromThw(1, 4, 6), {}}) == kInvalid);  // before the prompt
  CHECK(bad({2, model::MediaGrid::FromThw(1, 2, 2), {}}) == kInvalid);   // pads left over
  CHECK(bad({2, model::MediaGrid::FromThw(1, 3, 8), {}}) == kInvalid);   // not merge multiples
  CHECK(bad({2, model::MediaGrid::FromThw(0, 4, 6), {}}) == kInvalid);
  CHECK(PlaceHandoffImages(ids, {good[0], good[0]}, Rules()).status().code() == kInvalid);
  CHECK(PlaceHandoffImages(ids, {}, Rules()).status().code() == kInvalid);
  PromptRules text_only = Rules();
  text_only.accepts_images = false;
  CHECK(PlaceHandoffImages(ids, good, text_only).status().code() == kInvalid);
}

TEST_CASE("video pads expand and hand off by their kind", "[request_prep]") {
  constexpr int32_t kVideoPad = 10;
  PromptRules rules = Rules();
  rules.video_pad_id = kVideoPad;
  const std::vector<float> v(3 * kHidden, 1.0f), a(1 * kHidden, 2.0f);
  const std::vector<MediaRows> items = {
      {model::MediaGrid::FromThw(3, 2, 2, 2, model::MediaKind::kVideo), v, ContentHash{3, 4}},
      {model::MediaGrid::FromThw(1, 2, 2), a, ContentHash{5, 6}},
  };
  auto p = ExpandImages({1, kVideoPad, kPad, 2}, items, rules);
  REQUIRE(p.ok());
  CHECK(p->token_ids == std::vector<int32_t>{1, kVideoPad, kVideoPad, kVideoPad, kPad, 2});
  REQUIRE(p->images.size() == 2);
  CHECK(p->images[0].offset == 1);
  CHECK(p->images[0].length == 3);
  CHECK(p->images[1].offset == 4);
  // Text 0; video t 1..3 (h, w 1); image 4; text 5: next 6 at index 6.
  CHECK(p->positions.t == std::vector<int32_t>{0, 1, 2, 3, 4, 5});
  CHECK(p->positions.delta == 0);
  const HandoffPrompt h = MakeHandoffPrompt(*p);
  REQUIRE(h.images.size() == 2);
  CHECK(h.images[0].grid.kind == model::MediaKind::kVideo);
  auto placed = PlaceHandoffImages(h.token_ids, h.images, rules);
  REQUIRE(placed.ok());
  CHECK(placed->positions.t == p->positions.t);
  std::vector<HandoffMedia> as_image = h.images;
  as_image[0].grid.kind = model::MediaKind::kImage;
  CHECK(PlaceHandoffImages(h.token_ids, as_image, rules).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // A model without a video token refuses videos.
  CHECK(ExpandImages({1, kVideoPad, kPad, 2}, items, Rules()).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("max_tokens must fit the context, or fills it", "[request_prep]") {
  model::SamplingParams s;
  s.max_tokens = 10;
  CHECK(*ResolveMaxTokens(s, false, 22, Rules()) == 10);
  CHECK(ResolveMaxTokens(s, false, 23, Rules()).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(*ResolveMaxTokens(s, true, 30, Rules()) == 2);
  s.min_tokens = 3;
  CHECK(ResolveMaxTokens(s, true, 30, Rules()).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("scheduler parameters carry spans, eos and stop ids; the hand-off the prompt",
          "[request_prep]") {
  const std::vector<float> a(2 * kHidden, 1.0f);
  auto p = ExpandImages({1, kPad, 3}, {{model::MediaGrid::FromThw(1, 2, 4), a, ContentHash{3, 4}}},
                        Rules());
  REQUIRE(p.ok());
  model::SamplingParams s;
  s.stop_token_ids = {4};
  scheduler::RequestParams params = SchedulerParams(scheduler::RequestId{5}, *p, s, 7, Rules());
  CHECK(params.id == scheduler::RequestId{5});
  CHECK(params.prompt_token_ids == std::vector<int32_t>{1, kPad, kPad, 3});
  CHECK(params.max_tokens == 7);
  CHECK(params.eos_token_id == 15);
  CHECK(params.stop_token_ids == std::vector<int32_t>{4, 14});
  REQUIRE(params.mm_spans.size() == 1);
  CHECK(params.mm_spans[0].offset == 1);
  CHECK(params.mm_spans[0].length == 2);
  CHECK(params.mm_spans[0].content_hash == ContentHash{3, 4});
  s.ignore_eos = true;
  CHECK(SchedulerParams(scheduler::RequestId{6}, *p, s, 7, Rules()).stop_token_ids ==
        std::vector<int32_t>{4});
  HandoffPrompt h = MakeHandoffPrompt(*p);
  CHECK(h.token_ids == p->token_ids);
  REQUIRE(h.images.size() == 1);
  CHECK(h.images[0].offset == 1);
  CHECK(h.images[0].key == ContentHash{3, 4});
  CHECK(h.mrope_position_delta == p->positions.delta);
}

}  // namespace
}  // namespace mmserve::worker
