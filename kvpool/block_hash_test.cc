#include "kvpool/block_hash.h"

#include <catch2/catch.hpp>
#include <vector>

namespace mmserve {
namespace kvpool {
namespace {

constexpr int kBlockSize = 4;

std::vector<TokenId> Tokens(int n, TokenId first = 1) {
  std::vector<TokenId> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

TEST_CASE("equal blocks under equal parents hash equal; tokens and parents both matter",
          "[block_hash]") {
  std::vector<TokenId> a = Tokens(4), b = Tokens(4), c = Tokens(4);
  c[3] += 1;
  CHECK(ChainBlockHash(kRootBlockHash, a, kNoExtraKeys) ==
        ChainBlockHash(kRootBlockHash, b, kNoExtraKeys));
  CHECK(ChainBlockHash(kRootBlockHash, a, kNoExtraKeys) !=
        ChainBlockHash(kRootBlockHash, c, kNoExtraKeys));
  CHECK(ChainBlockHash(kRootBlockHash, a, kNoExtraKeys) != ChainBlockHash(42, a, kNoExtraKeys));
  CHECK(ChainBlockHash(kRootBlockHash, a, kNoExtraKeys) != ChainBlockHash(kRootBlockHash, a, 7));
}

TEST_CASE("a block key chains to the previous block's hash", "[block_hash]") {
  std::vector<TokenId> t = Tokens(8);
  BlockKey k0 = MakeBlockKey(kRootBlockHash, t, {}, 0, kBlockSize);
  BlockKey k1 = MakeBlockKey(k0.hash, t, {}, 1, kBlockSize);
  CHECK(k0.parent_hash == kRootBlockHash);
  CHECK(k1.parent_hash == k0.hash);
  CHECK(k1.hash == ChainBlockHash(k0.hash, absl::MakeSpan(t).subspan(4, 4), kNoExtraKeys));
  // Same second-block tokens after a different first block: different key.
  std::vector<TokenId> u = t;
  u[0] = 99;
  BlockKey u0 = MakeBlockKey(kRootBlockHash, u, {}, 0, kBlockSize);
  CHECK(MakeBlockKey(u0.hash, u, {}, 1, kBlockSize).hash != k1.hash);
}

TEST_CASE("only blocks that overlap an image span carry its content hash", "[block_hash]") {
  // Image placeholders occupy tokens [5, 7): block 1 only.
  std::vector<MultimodalSpan> spans = {{5, 2, HashBytes("cat.png")}};
  CHECK(ExtraKeysHash(spans, 0, 4) == kNoExtraKeys);
  CHECK(ExtraKeysHash(spans, 4, 8) != kNoExtraKeys);
  CHECK(ExtraKeysHash(spans, 8, 12) == kNoExtraKeys);
  // Boundaries are half-open: a span ending at 4 does not touch [4, 8).
  std::vector<MultimodalSpan> edge = {{2, 2, HashBytes("cat.png")}};
  CHECK(ExtraKeysHash(edge, 4, 8) == kNoExtraKeys);
}

TEST_CASE("the same placeholder tokens with different images give different block hashes",
          "[block_hash]") {
  std::vector<TokenId> t(8, /*placeholder id=*/151655);
  std::vector<MultimodalSpan> cat = {{0, 8, HashBytes("cat.png")}};
  std::vector<MultimodalSpan> dog = {{0, 8, HashBytes("dog.png")}};
  std::vector<MultimodalSpan> cat_again = {{0, 8, HashBytes("cat.png")}};
  BlockKey kc = MakeBlockKey(kRootBlockHash, t, cat, 0, kBlockSize);
  BlockKey kd = MakeBlockKey(kRootBlockHash, t, dog, 0, kBlockSize);
  CHECK(kc.hash != kd.hash);
  CHECK(kc.hash == MakeBlockKey(kRootBlockHash, t, cat_again, 0, kBlockSize).hash);
  CHECK(kc.hash != MakeBlockKey(kRootBlockHash, t, {}, 0, kBlockSize).hash);
}

TEST_CASE("an image starting at a different offset in the block changes the extra keys",
          "[block_hash]") {
  std::vector<MultimodalSpan> at1 = {{1, 3, HashBytes("cat.png")}};
  std::vector<MultimodalSpan> at2 = {{2, 3, HashBytes("cat.png")}};
  CHECK(ExtraKeysHash(at1, 0, 4) != ExtraKeysHash(at2, 0, 4));
}

}  // namespace
}  // namespace kvpool
}  // namespace mmserve
