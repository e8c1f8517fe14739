// The work item of paged attention's vector path and its AVX-512 step (a
// detail of model/cpu: include paged_attention.h).
//
// At the kAvx512 level (cpu_isa.h) the vector path weighs values on
// 16-lane registers (32 of them: a tile of 6 queries x 64 outputs, against
// AVX2's 3 x 32), keeping each output lane's chain o = fma(p_j, v_j, o)
// over the keys in order, so the results are bitwise those of AVX2. Scoring
// and softmax stay on the AVX2 code at both levels: scoring two queries per
// zmm (the halves) measured 0.9x, and 3 or 4 queries x 4 keys on AVX-512's
// 32 ymm registers 0.95-0.97x, the AVX2 tile of 2 x 4 (attention_bench,
// Qwen2-0.5B shape, 1 thread, CPU clock, Zen 4); softmax's sum order is part
// of its result.
#ifndef MMSERVE_MODEL_CPU_PAGED_ATTENTION_TILE_H_
#define MMSERVE_MODEL_CPU_PAGED_ATTENTION_TILE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mmserve::model::cpu::internal {

// Keys whose values stay in L1 while every query of a tile weighs them. A
// token's K or V row of one KV head is a strided slice of the cache ([token]
// [kv_head][head_dim]), so 32 keys of 64 or 128 floats fill only some L1
// sets; 64 keys thrash them.
inline constexpr int64_t kValueBlock = 32;

// The queries of one work item: `rows` consecutive rows of one sequence
// times the `group` query heads of KV head `kv_head`; query m = r * group + g
// is row r's head first_head + g and sees keys [0, first_keys + r).
struct QueryTile {
  const float* q = nullptr;  // row 0 of the tile
  float* out = nullptr;
  int64_t row_stride = 0;  // floats from one row of q / out to the next
  int64_t rows = 0;
  int64_t first_keys = 0;
  int64_t first_head = 0;
  int64_t group = 0;
  int64_t kv_head = 0;
  const int64_t* key_offset = nullptr;  // key j's token at key/value + key_offset[j]
  bool avx512 = false;                  // weigh with WeighTileAvx512
};

// Per-thread buffers, reused from call to call: where each key the tile sees
// lives, each query's pointers and key count (computed once per tile, not per
// use), and its scores.
struct TileScratch {
  std::vector<int64_t> key_offset;
  std::vector<const float*> query;
  std::vector<float*> out;
  std::vector<int64_t> keys;
  std::vector<float> scores;  // [query][stride]
};

// True for the head_dims the AVX-512 step takes (16, 32, 64, 128: 8 nc with
// nc even); head_dim 8 stays on AVX2 at every level.
inline bool Avx512AttentionHeadDim(int64_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

// The weighing schedule of both levels: x.out[m] += the probabilities
// x.scores[m] times the values of the keys query m sees, kValueBlock keys
// at a time, for output floats [c0, c0 + chunk) with c0 stepping by `chunk`
// up to head_dim, QM queries sharing each value load. weigh(p, o, c0, begin,
// end, n) weighs keys [begin, end) for the n (QM or 1) queries p/o (o
// already offset by c0).
template <int QM, typename Weigh>
void WeighSchedule(const QueryTile& t, int64_t stride, int64_t head_dim, int64_t chunk,
                   TileScratch& x, Weigh weigh) {
  const int64_t count = t.rows * t.group;
  const int64_t last_keys = t.first_keys + t.rows - 1;
  const float* p[QM];
  float* o[QM];
  for (int64_t b0 = 0; b0 < last_keys; b0 += kValueBlock) {
    const int64_t b1 = std::min(b0 + kValueBlock, last_keys);
    const int64_t first = std::max<int64_t>(0, b0 - t.first_keys + 1) * t.group;
    // Keys [b0, end(m)) of this block are the ones query m sees.
    auto end = [&](int64_t m) { return std::min(b1, x.keys[m]); };
    for (int64_t c0 = 0; c0 < head_dim; c0 += chunk) {
      int64_t m = first;
      for (; m + QM <= count; m += QM) {
        // The queries share keys up to the first's end (key counts ascend
        // with m); the later rows finish their few extra keys alone.
        for (int i = 0; i < QM; ++i) {
          p[i] = x.scores.data() + (m + i) * stride;
          o[i] = x.out[m + i] + c0;
        }
        weigh(p, o, c0, b0, end(m), QM);
        for (int i = 1; i < QM; ++i) weigh(&p[i], &o[i], c0, end(m), end(m + i), 1);
      }
      for (; m < count; ++m) {
        p[0] = x.scores.data() + m * stride;
        o[0] = x.out[m] + c0;
        weigh(p, o, c0, b0, end(m), 1);
      }
    }
  }
}

// As WeighTile (paged_attention.cc), on 16-lane registers: x.out[m] += probabilities x.scores[m]
// times the values of the keys query m sees, x.out zeroed by the caller.
// CPU must have AVX-512.
void WeighTileAvx512(int nc, const QueryTile& t, int64_t stride, const float* value,
                     TileScratch& x);

}  // namespace mmserve::model::cpu::internal

#endif  // MMSERVE_MODEL_CPU_PAGED_ATTENTION_TILE_H_
