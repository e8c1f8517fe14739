// The AVX-512 steps of paged attention's vector path (paged_attention_tile.h).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "common/logging.h"
#include "model/cpu/paged_attention_tile.h"

namespace mmserve::model::cpu::internal {
namespace {

// Register tile (32 zmm): 6 queries x 4 output vectors of 16 lanes (24
// accumulators, 6 broadcasts, one value).
constexpr int kValueQueries = 6;
constexpr int kValueVectors = 4;

#include "model/cpu/avx512_region_begin.inc"

// As in paged_attention.cc: keeps a loaded vector in a register.
inline void InRegister(__m512& v) { asm("" : "+v"(v)); }

// WeighValues (paged_attention.cc) on 16-lane registers: per query and lane
// the chain o = fma(p_j, v_j, o) over keys [begin, end) in order.
template <int QM, int CC>
inline void WeighValues(const float* const* p, float* const* o, const float* value,
                        const int64_t* key_offset, int64_t begin, int64_t end) {
  __m512 acc[QM][CC];
  _Pragma("GCC unroll 8") for (int m = 0; m < QM; ++m) {
    _Pragma("GCC unroll 8") for (int c = 0; c < CC; ++c) {
      acc[m][c] = _mm512_loadu_ps(o[m] + 16 * c);
    }
  }
  for (int64_t j = begin; j < end; ++j) {
    const float* vp = value + key_offset[j];
    __m512 pv[QM];
    _Pragma("GCC unroll 8") for (int m = 0; m < QM; ++m) pv[m] = _mm512_set1_ps(p[m][j]);
    _Pragma("GCC unroll 8") for (int c = 0; c < CC; ++c) {
      __m512 v = _mm512_loadu_ps(vp + 16 * c);
      InRegister(v);
      _Pragma("GCC unroll 8") for (int m = 0; m < QM; ++m) {
        acc[m][c] = _mm512_fmadd_ps(pv[m], v, acc[m][c]);
      }
    }
  }
  _Pragma("GCC unroll 8") for (int m = 0; m < QM; ++m) {
    _Pragma("GCC unroll 8") for (int c = 0; c < CC; ++c) {
      _mm512_storeu_ps(o[m] + 16 * c, acc[m][c]);
    }
  }
}

// head_dim = 8 NC = 16 V: V zmm vectors per row, weighed kCc at a time.
template <int NC>
void WeighTile(const QueryTile& t, int64_t stride, const float* value, TileScratch& x) {
  constexpr int kV = NC / 2;
  constexpr int kCc = kV < kValueVectors ? kV : kValueVectors;
  WeighSchedule<kValueQueries>(
      t, stride, 16 * kV, 16 * kCc, x,
      [&](const float* const* p, float* const* o, int64_t c0, int64_t begin, int64_t end, int n) {
        if (n == 1) return WeighValues<1, kCc>(p, o, value + c0, t.key_offset, begin, end);
        WeighValues<kValueQueries, kCc>(p, o, value + c0, t.key_offset, begin, end);
      });
}

#include "model/cpu/avx512_region_end.inc"

}  // namespace

void WeighTileAvx512(int nc, const QueryTile& t, int64_t stride, const float* value,
                     TileScratch& x) {
  switch (nc) {
    case 2:
      return WeighTile<2>(t, stride, value, x);
    case 4:
      return WeighTile<4>(t, stride, value, x);
    case 8:
      return WeighTile<8>(t, stride, value, x);
    case 16:
      return WeighTile<16>(t, stride, value, x);
    default:
      LOG(FATAL) << "no AVX-512 attention for head_dim " << 8 * nc;
  }
}

}  // namespace mmserve::model::cpu::internal
