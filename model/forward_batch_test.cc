#include "model/forward_batch.h"

#include <catch2/catch.hpp>
#include <string>

namespace mmserve::model {
namespace {

// The example from forward_batch.h: A prefills 3 tokens into block 4, B
// decodes at position 9 with blocks {7, 2} (block_size 8).
ForwardBatch Example() {
  ForwardBatch b;
  b.token_ids = {11, 12, 13, 99};
  b.positions = {0, 1, 2, 9, 0, 1, 2, 9, 0, 1, 2, 9};
  b.slot_mapping = {32, 33, 34, 2 * 8 + 1};
  b.sequences = {{0, 3, 3, {4}}, {3, 1, 10, {7, 2}}};
  b.logits_rows = {2, 3};
  return b;
}

const ForwardBatchLimits kLimits{/*vocab_size=*/100, /*block_size=*/8, /*num_blocks=*/8};

std::string Error(const ForwardBatch& b) {
  absl::Status s = ValidateForwardBatch(b, kLimits);
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  return std::string(s.message());
}

TEST_CASE("the documented example batch is valid", "[forward_batch]") {
  CHECK(ValidateForwardBatch(Example(), kLimits).ok());
}

TEST_CASE("array sizes must agree with the token count", "[forward_batch]") {
  ForwardBatch b = Example();
  b.positions.pop_back();
  CHECK(Error(b).find("positions") != std::string::npos);
  b = Example();
  b.slot_mapping.push_back(0);
  CHECK(Error(b).find("slot_mapping") != std::string::npos);
  CHECK(Error(ForwardBatch{}).find("no tokens") != std::string::npos);
}

TEST_CASE("slots must match the block table at each row's cache position", "[forward_batch]") {
  ForwardBatch b = Example();
  b.slot_mapping[3] = 7 * 8 + 1;  // position 9 is in the second block (2), not 7
  CHECK(Error(b).find("slot_mapping[3]") != std::string::npos);
}

TEST_CASE("block tables must cover the context and name existing blocks", "[forward_batch]") {
  ForwardBatch b = Example();
  b.sequences[1].block_table = {7};
  CHECK(Error(b).find("needs 2") != std::string::npos);
  b = Example();
  b.sequences[0].block_table = {8};
  CHECK(Error(b).find("outside [0, 8)") != std::string::npos);
}

TEST_CASE("rows belong to exactly one sequence", "[forward_batch]") {
  ForwardBatch b = Example();
  b.sequences[1].query_start = 2;  // overlaps A's last row and leaves row 3 out
  b.slot_mapping[2] = 17;
  CHECK(!ValidateForwardBatch(b, kLimits).ok());
  b = Example();
  b.sequences.pop_back();
  CHECK(Error(b).find("row 3 belongs to no sequence") != std::string::npos);
  b = Example();
  b.sequences[0].context_len = 2;
  CHECK(Error(b).find("context_len 2 < query_len 3") != std::string::npos);
}

TEST_CASE("token ids must be in the vocabulary unless the row is overridden", "[forward_batch]") {
  ForwardBatch b = Example();
  b.token_ids[1] = 100;
  CHECK(Error(b).find("token id 100") != std::string::npos);
  const float embedding[4] = {0, 0, 0, 0};
  b.embedding_overrides = {{1, embedding}};
  CHECK(ValidateForwardBatch(b, kLimits).ok());
  b.embedding_overrides.push_back({1, embedding});
  CHECK(Error(b).find("overridden twice") != std::string::npos);
}

TEST_CASE("logits rows must exist", "[forward_batch]") {
  ForwardBatch b = Example();
  b.logits_rows = {4};
  CHECK(Error(b).find("logits row 4") != std::string::npos);
}

}  // namespace
}  // namespace mmserve::model
