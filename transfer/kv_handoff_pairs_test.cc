#include "transfer/kv_handoff_pairs.h"

#include <catch2/catch.hpp>
#include <string>

namespace mmserve::transfer {
namespace {

// "p>d:src>dst/count" per pair.
std::string Describe(const std::vector<KvRankPair>& pairs) {
  std::string out;
  for (const KvRankPair& x : pairs) {
    out += std::to_string(x.prefill_rank) + ">" + std::to_string(x.decode_rank) + ":" +
           std::to_string(x.heads.src_first) + ">" + std::to_string(x.heads.dst_first) + "/" +
           std::to_string(x.heads.count) + " ";
  }
  return out;
}

std::string Pairs(KvRanks prefill, KvRanks decode) {
  auto pairs = PairKvRanks(prefill, decode);
  REQUIRE(pairs.ok());
  return Describe(*pairs);
}

TEST_CASE("prefill and decode ranks pair by the KV heads they share") {
  // One rank each: everything.
  CHECK(Pairs({1, 2}, {1, 2}) == "0>0:0>0/2 ");
  // Equal TP: rank r -> rank r.
  CHECK(Pairs({2, 1}, {2, 1}) == "0>0:0>0/1 1>1:0>0/1 ");
  // 2 -> 1: both prefill ranks into the decode rank, at their heads.
  CHECK(Pairs({2, 1}, {1, 2}) == "0>0:0>0/1 1>0:0>1/1 ");
  // 1 -> 2: the prefill rank sends each decode rank its half.
  CHECK(Pairs({1, 2}, {2, 1}) == "0>0:0>0/1 0>1:1>0/1 ");
  // Ranges that straddle: 2 x 3 heads -> 3 x 2.
  CHECK(Pairs({2, 3}, {3, 2}) == "0>0:0>0/2 0>1:2>0/1 1>1:0>1/1 1>2:1>0/2 ");
}

TEST_CASE("instances that split different numbers of KV heads are refused, naming both TPs") {
  auto pairs = PairKvRanks({2, 1}, {1, 4});
  CHECK(pairs.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(pairs.status().message()).find("tp=2") != std::string::npos);
  CHECK(std::string(pairs.status().message()).find("tp=1") != std::string::npos);
  CHECK(PairKvRanks({0, 1}, {1, 1}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(PairKvRanks({1, 1}, {1, 0}).status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mmserve::transfer
