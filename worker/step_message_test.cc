#include "worker/step_message.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

namespace mmserve::worker {
namespace {

constexpr int64_t kHidden = 8;

// Two sequences: a 3-token prefill chunk with an image row, one decode.
model::ForwardBatch SampleBatch(const std::vector<float>& image) {
  model::ForwardBatch b;
  b.token_ids = {11, 12, 13, 99};
  b.positions = {0, 1, 2, 9, 0, 1, 2, 9, 0, 1, 2, 9};
  b.slot_mapping = {32, 33, 34, 17};
  b.sequences = {{0, 3, 3, {4}}, {3, 1, 10, {7, 2}}};
  b.logits_rows = {2, 3};
  b.embedding_overrides = {{1, image.data()}};
  return b;
}

std::vector<float> Image() {
  std::vector<float> v(kHidden);
  for (int i = 0; i < kHidden; ++i) v[i] = 0.5f * i - 1.0f;
  return v;
}

void CheckSameBatch(const model::ForwardBatch& got, const model::ForwardBatch& want) {
  CHECK(got.token_ids == want.token_ids);
  CHECK(got.positions == want.positions);
  CHECK(got.slot_mapping == want.slot_mapping);
  CHECK(got.logits_rows == want.logits_rows);
  REQUIRE(got.sequences.size() == want.sequences.size());
  for (size_t i = 0; i < got.sequences.size(); ++i) {
    CHECK(got.sequences[i].query_start == want.sequences[i].query_start);
    CHECK(got.sequences[i].query_len == want.sequences[i].query_len);
    CHECK(got.sequences[i].context_len == want.sequences[i].context_len);
    CHECK(got.sequences[i].block_table == want.sequences[i].block_table);
  }
  REQUIRE(got.embedding_overrides.size() == want.embedding_overrides.size());
  for (size_t i = 0; i < got.embedding_overrides.size(); ++i) {
    CHECK(got.embedding_overrides[i].row == want.embedding_overrides[i].row);
    CHECK(std::memcmp(got.embedding_overrides[i].values, want.embedding_overrides[i].values,
                      kHidden * sizeof(float)) == 0);
  }
}

TEST_CASE("a step with an inline image embedding survives encode, decode and resolve",
          "[step_message]") {
  const std::vector<float> image = Image();
  const model::ForwardBatch batch = SampleBatch(image);
  auto m = StepMessageFromBatch(batch, kHidden, EmbeddingPlacement::kInline);
  REQUIRE(m.ok());
  std::vector<uint8_t> slot(4096);
  auto n = EncodeStep(*m, absl::MakeSpan(slot));
  REQUIRE(n.ok());
  CHECK(*n == EncodedStepBytes(*m));
  StepMessage got;
  REQUIRE(DecodeStep(absl::MakeConstSpan(slot.data(), *n), &got).ok());
  CHECK(got.kind == StepKind::kForward);
  REQUIRE(ResolveEmbeddings({}, kHidden, &got).ok());
  CheckSameBatch(got.batch, batch);
  // The values now live in the message, not in the sender's buffer.
  CHECK(got.batch.embedding_overrides[0].values != image.data());
}

TEST_CASE("a shared-buffer descriptor carries only an offset into the receive buffer",
          "[step_message]") {
  std::vector<float> buffer(4 * kHidden, 0.0f);
  const std::vector<float> image = Image();
  std::copy(image.begin(), image.end(), buffer.begin() + 2 * kHidden);
  model::ForwardBatch batch = SampleBatch(image);
  batch.embedding_overrides[0].values = buffer.data() + 2 * kHidden;
  const absl::Span<const uint8_t> shared(reinterpret_cast<const uint8_t*>(buffer.data()),
                                         buffer.size() * sizeof(float));
  auto m = StepMessageFromBatch(batch, kHidden, EmbeddingPlacement::kSharedBuffer, shared);
  REQUIRE(m.ok());
  CHECK(m->inline_floats.empty());
  REQUIRE(m->embeddings.size() == 1);
  CHECK(m->embeddings[0].offset == 2 * kHidden * sizeof(float));
  std::vector<uint8_t> slot(4096);
  auto n = EncodeStep(*m, absl::MakeSpan(slot));
  REQUIRE(n.ok());
  StepMessage got;
  REQUIRE(DecodeStep(absl::MakeConstSpan(slot.data(), *n), &got).ok());
  REQUIRE(ResolveEmbeddings(shared, kHidden, &got).ok());
  CHECK(got.batch.embedding_overrides[0].values == buffer.data() + 2 * kHidden);
  CheckSameBatch(got.batch, batch);

  SECTION("an override outside the buffer is refused at the sender") {
    batch.embedding_overrides[0].values = image.data();
    CHECK(absl::IsInvalidArgument(
        StepMessageFromBatch(batch, kHidden, EmbeddingPlacement::kSharedBuffer, shared).status()));
  }
  SECTION("a descriptor past the receiver's buffer is refused") {
    CHECK(absl::IsInvalidArgument(ResolveEmbeddings(shared.subspan(0, 16), kHidden, &got)));
  }
  SECTION("a descriptor of the wrong length is refused") {
    CHECK(absl::IsInvalidArgument(ResolveEmbeddings(shared, kHidden + 1, &got)));
  }
}

TEST_CASE("every truncation and corruption of a step is DataLoss, never a crash",
          "[step_message]") {
  const std::vector<float> image = Image();
  auto m = StepMessageFromBatch(SampleBatch(image), kHidden, EmbeddingPlacement::kInline);
  REQUIRE(m.ok());
  std::vector<uint8_t> slot(EncodedStepBytes(*m));
  REQUIRE(EncodeStep(*m, absl::MakeSpan(slot)).ok());
  StepMessage got;
  for (size_t n = 0; n < slot.size(); ++n) {
    INFO("truncated to " << n << " bytes");
    CHECK(absl::IsDataLoss(DecodeStep(absl::MakeConstSpan(slot.data(), n), &got)));
  }
  std::vector<uint8_t> longer = slot;
  longer.push_back(0);
  CHECK(absl::IsDataLoss(DecodeStep(longer, &got)));
  std::vector<uint8_t> bad = slot;
  bad[0] ^= 1;  // magic
  CHECK(absl::IsDataLoss(DecodeStep(bad, &got)));
  bad = slot;
  bad[4] = 77;  // kind
  CHECK(absl::IsDataLoss(DecodeStep(bad, &got)));
  // A huge token count must be refused before anything is allocated.
  bad = slot;
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(bad.data() + 8, &huge, sizeof(huge));
  CHECK(absl::IsDataLoss(DecodeStep(bad, &got)));
}

TEST_CASE("kAllocateKv and kStop carry their kind and cache size", "[step_message]") {
  StepMessage m;
  m.kind = StepKind::kAllocateKv;
  m.kv_blocks = 1234;
  m.kv_block_size = 16;
  std::vector<uint8_t> slot(EncodedStepBytes(m));
  REQUIRE(EncodeStep(m, absl::MakeSpan(slot)).ok());
  StepMessage got;
  REQUIRE(DecodeStep(slot, &got).ok());
  CHECK(got.kind == StepKind::kAllocateKv);
  CHECK(got.kv_blocks == 1234);
  CHECK(got.kv_block_size == 16);
  CHECK(got.batch.token_ids.empty());
  m = StepMessage();
  m.kind = StepKind::kStop;
  REQUIRE(EncodeStep(m, absl::MakeSpan(slot)).ok());
  REQUIRE(DecodeStep(absl::MakeConstSpan(slot.data(), EncodedStepBytes(m)), &got).ok());
  CHECK(got.kind == StepKind::kStop);
}

TEST_CASE("kKvRegister and kKvCheck carry their kind and the checked blocks", "[step_message]") {
  StepMessage m;
  m.kind = StepKind::kKvCheck;
  m.batch.sequences.emplace_back();
  m.batch.sequences.back().block_table = {9, 2, 5};
  std::vector<uint8_t> slot(EncodedStepBytes(m));
  REQUIRE(EncodeStep(m, absl::MakeSpan(slot)).ok());
  StepMessage got;
  REQUIRE(DecodeStep(slot, &got).ok());
  CHECK(got.kind == StepKind::kKvCheck);
  REQUIRE(got.batch.sequences.size() == 1);
  CHECK(got.batch.sequences[0].block_table == std::vector<int32_t>{9, 2, 5});
  m = StepMessage();
  m.kind = StepKind::kKvRegister;
  slot.assign(EncodedStepBytes(m), 0);
  REQUIRE(EncodeStep(m, absl::MakeSpan(slot)).ok());
  REQUIRE(DecodeStep(slot, &got).ok());
  CHECK(got.kind == StepKind::kKvRegister);
  CHECK(got.batch.sequences.empty());
}

TEST_CASE("a step larger than its slot is ResourceExhausted", "[step_message]") {
  const std::vector<float> image = Image();
  auto m = StepMessageFromBatch(SampleBatch(image), kHidden, EmbeddingPlacement::kInline);
  REQUIRE(m.ok());
  std::vector<uint8_t> slot(EncodedStepBytes(*m) - 1);
  CHECK(absl::IsResourceExhausted(EncodeStep(*m, absl::MakeSpan(slot)).status()));
}

TEST_CASE("a row's DeepStack features reach the ranks inline and in the shared buffer",
          "[step_message]") {
  // One row: its embedding then two features, side by side as they arrive.
  std::vector<float> buffer(5 * kHidden, 0.0f);
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<float>(i);
  const float* row = buffer.data() + 2 * kHidden;
  model::ForwardBatch batch = SampleBatch(Image());
  batch.embedding_overrides = {{1, row, row + kHidden, 2}};
  const absl::Span<const uint8_t> shared(reinterpret_cast<const uint8_t*>(buffer.data()),
                                         buffer.size() * sizeof(float));
  for (EmbeddingPlacement placement :
       {EmbeddingPlacement::kInline, EmbeddingPlacement::kSharedBuffer}) {
    INFO("placement " << static_cast<int>(placement));
    auto m = StepMessageFromBatch(batch, kHidden, placement, shared);
    REQUIRE(m.ok());
    CHECK(m->embeddings[0].length == 3 * kHidden);
    std::vector<uint8_t> slot(4096);
    auto n = EncodeStep(*m, absl::MakeSpan(slot));
    REQUIRE(n.ok());
    StepMessage got;
    REQUIRE(DecodeStep(absl::MakeConstSpan(slot.data(), *n), &got).ok());
    REQUIRE(ResolveEmbeddings(shared, kHidden, &got).ok());
    const model::EmbeddingOverride& o = got.batch.embedding_overrides.at(0);
    CHECK(o.deepstack_layers == 2);
    REQUIRE(o.deepstack != nullptr);
    CHECK(std::memcmp(o.values, row, kHidden * sizeof(float)) == 0);
    CHECK(std::memcmp(o.deepstack, row + kHidden, 2 * kHidden * sizeof(float)) == 0);
    // A receiver that reads the features as another count refuses the row.
    got.embeddings[0].deepstack_layers = 1;
    CHECK(absl::IsInvalidArgument(ResolveEmbeddings(shared, kHidden, &got)));
  }
  // Shared placement needs the features right after the embedding.
  std::vector<float> apart(2 * kHidden);
  batch.embedding_overrides[0].deepstack = apart.data();
  CHECK(absl::IsInvalidArgument(
      StepMessageFromBatch(batch, kHidden, EmbeddingPlacement::kSharedBuffer, shared).status()));
}

}  // namespace
}  // namespace mmserve::worker
