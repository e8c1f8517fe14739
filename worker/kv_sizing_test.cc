#include "worker/kv_sizing.h"

#include <catch2/catch.hpp>

namespace mmserve::worker {
namespace {

KvSizingInputs Demo() {
  KvSizingInputs in;
  in.block_size = 16;
  in.max_num_seqs = 32;
  in.max_model_len = 4096;
  in.block_bytes = 48 << 10;  // 3 layers x K,V x 16 tokens x 2 heads x 64 x 4 bytes
  in.available_bytes = 20ll << 30;
  in.memory_fraction = 0.3;
  return in;
}

TEST_CASE("the KV cache is sized by what the engine can use when memory allows", "[kv]") {
  auto s = DecideKvBlocks(Demo());
  REQUIRE(s.ok());
  CHECK(s->wanted_blocks == 32 * 256);
  CHECK(s->num_blocks == 32 * 256);  // 384 MiB, not 30% of 20 GiB
  CHECK(s->Describe().find("all the engine can use") != std::string::npos);
}

TEST_CASE("max_model_len rounds up to whole blocks", "[kv]") {
  KvSizingInputs in = Demo();
  in.max_model_len = 4097;
  in.max_num_seqs = 3;
  auto s = DecideKvBlocks(in);
  REQUIRE(s.ok());
  CHECK(s->num_blocks == 3 * 257);
}

TEST_CASE("free memory caps the KV cache", "[kv]") {
  KvSizingInputs in = Demo();
  in.available_bytes = 100 << 20;  // 30 MiB share = 640 blocks of 48 KiB
  auto s = DecideKvBlocks(in);
  REQUIRE(s.ok());
  CHECK(s->num_blocks == 640);
  CHECK(s->Describe().find("capped by free memory") != std::string::npos);
}

TEST_CASE("an explicit size is taken as is, even above what the engine can use", "[kv]") {
  KvSizingInputs in = Demo();
  in.requested_bytes = 1ull << 30;
  auto s = DecideKvBlocks(in);
  REQUIRE(s.ok());
  CHECK(s->num_blocks == (1 << 30) / (48 << 10));
  CHECK(s->requested);
}

TEST_CASE("too little memory or nonsense sizes are refused", "[kv]") {
  KvSizingInputs in = Demo();
  in.available_bytes = 100 << 10;
  CHECK(DecideKvBlocks(in).status().code() == absl::StatusCode::kResourceExhausted);
  in = Demo();
  in.max_num_seqs = 0;
  CHECK(DecideKvBlocks(in).status().code() == absl::StatusCode::kInvalidArgument);
  in = Demo();
  in.block_bytes = 0;
  CHECK(DecideKvBlocks(in).status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mmserve::worker
