#include "transfer/kv_segments.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "common/crc32c.h"
#include "transfer/checksum_worker.h"
#include "transfer/kv_handoff.h"

namespace mmserve::transfer {
namespace {

model::KvCacheShape Shape(int64_t blocks, int64_t heads) {
  return {
      .num_layers = 3, .num_blocks = blocks, .block_size = 4, .num_kv_heads = heads, .head_dim = 8};
}

std::unique_ptr<model::KvCache> Filled(const model::KvCacheShape& shape, uint32_t seed) {
  auto cache = model::KvCache::Create(shape);
  REQUIRE(cache.ok());
  std::mt19937 rng(seed);
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    for (float* plane : {(*cache)->Key(l), (*cache)->Value(l)}) {
      for (int64_t i = 0; i < shape.LayerPlaneFloats(); ++i) plane[i] = float(rng() % 1000);
    }
  }
  return *std::move(cache);
}

const uint8_t* Bytes(const model::KvCache& c) { return reinterpret_cast<const uint8_t*>(c.Key(0)); }

uint32_t Fold(const std::vector<KvSegment>& segments, const uint8_t* base) {
  uint32_t crc = 0;
  for (const KvSegment& s : segments) crc = Crc32cExtend(crc, base + s.src, s.bytes);
  return crc;
}

TEST_CASE("hand-off segments merge consecutive runs and fold to KvBlocksCrc", "[kv_handoff]") {
  auto src = Filled(Shape(8, 2), 1);
  const std::vector<int32_t> from = {2, 3, 4, 7, 0}, to = {0, 1, 5, 6, 2};
  std::vector<KvSegment> segs = PlanKvSegments(src->shape(), Shape(8, 2), from, to, 0);
  // Per plane: {2,3} -> {0,1} is one run; 4, 7 and 0 are one segment each.
  CHECK(segs.size() == 3 * 2 * 4);
  CHECK(Fold(segs, Bytes(*src)) == KvBlocksCrc(*src, from));
  // A head slice: one segment per token.
  std::vector<KvSegment> sliced = PlanKvSegments(src->shape(), Shape(8, 1), from, to, 1);
  CHECK(sliced.size() == 3 * 2 * 5 * 4);
  CHECK(Fold(sliced, Bytes(*src)) == KvBlocksCrc(*src, from, 1, 1));
}

TEST_CASE("chunked segments cover the same bytes in order, and the copy checksums them",
          "[kv_handoff]") {
  auto src = Filled(Shape(8, 2), 2);
  auto dst = model::KvCache::Create(Shape(8, 2));
  REQUIRE(dst.ok());
  const std::vector<int32_t> from = {0, 1, 2, 5, 6}, to = {3, 4, 5, 0, 7};
  std::vector<KvSegment> segs = PlanKvSegments(src->shape(), Shape(8, 2), from, to, 0);
  for (uint64_t chunk : {uint64_t{100}, uint64_t{1000}, uint64_t{1} << 20}) {
    CAPTURE(chunk);
    std::vector<KvSegment> flat;
    for (const auto& job : ChunkKvSegments(segs, chunk)) {
      uint64_t bytes = 0;
      for (const KvSegment& s : job) bytes += s.bytes;
      CHECK(bytes <= chunk);
      flat.insert(flat.end(), job.begin(), job.end());
    }
    CHECK(Fold(flat, Bytes(*src)) == KvBlocksCrc(*src, from));
    ChecksumWorker helper;
    std::memset((*dst)->Key(0), 0, (*dst)->bytes());
    const uint32_t crc = CopyKvSegments(ChunkKvSegments(segs, chunk), Bytes(*src),
                                        reinterpret_cast<uint8_t*>((*dst)->Key(0)), helper);
    CHECK(crc == KvBlocksCrc(*src, from));
    CHECK(KvBlocksCrc(**dst, to) == crc);
  }
}

}  // namespace
}  // namespace mmserve::transfer
