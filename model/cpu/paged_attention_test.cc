#include "model/cpu/paged_attention.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "model/cpu/cpu_isa.h"

namespace mmserve::model::cpu {
namespace {

// Straightforward causal attention over contiguous K/V [len][kv_heads][hd],
// in double: the ground truth for the paged kernel.
std::vector<double> Reference(const std::vector<float>& q, const std::vector<float>& k,
                              const std::vector<float>& v, int64_t q_rows, int64_t len,
                              int64_t heads, int64_t kv_heads, int64_t hd, double scale) {
  std::vector<double> out(q_rows * heads * hd, 0.0);
  const int64_t group = heads / kv_heads;
  for (int64_t i = 0; i < q_rows; ++i) {
    const int64_t keys = len - q_rows + i + 1;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / group;
      std::vector<double> s(keys);
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < keys; ++j) {
        double d = 0;
        for (int64_t c = 0; c < hd; ++c) {
          d += double(q[(i * heads + h) * hd + c]) * k[(j * kv_heads + g) * hd + c];
        }
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      for (int64_t j = 0; j < keys; ++j) sum += (s[j] = std::exp(s[j] - mx));
      for (int64_t j = 0; j < keys; ++j) {
        for (int64_t c = 0; c < hd; ++c) {
          out[(i * heads + h) * hd + c] += s[j] / sum * v[(j * kv_heads + g) * hd + c];
        }
      }
    }
  }
  return out;
}

// Scatters contiguous K or V rows into a paged buffer through a block table.
std::vector<float> Page(const std::vector<float>& rows, int64_t len, int64_t width,
                        const std::vector<int32_t>& table, int64_t block_size, int64_t num_blocks) {
  std::vector<float> paged(num_blocks * block_size * width, NAN);  // unused slots poison
  for (int64_t j = 0; j < len; ++j) {
    const int64_t slot = table[j / block_size] * block_size + j % block_size;
    std::memcpy(&paged[slot * width], &rows[j * width], width * sizeof(float));
  }
  return paged;
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

TEST_CASE("one key attends to itself: the output is its value", "[attention]") {
  ThreadPool pool(1);
  const int64_t heads = 2, hd = 8;
  std::vector<float> q = Random(heads * hd, 1), k = Random(hd, 2), v = Random(hd, 3);
  std::vector<int32_t> table = {0};
  PagedKvLayer kv{k.data(), v.data(), /*block_size=*/1, /*num_kv_heads=*/1, hd};
  std::vector<float> out(heads * hd);
  PagedAttention(pool, q.data(), heads, kv, {{0, 1, 1, table.data()}}, 0.3f, out.data());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t c = 0; c < hd; ++c) CHECK(out[h * hd + c] == v[c]);
  }
}

TEST_CASE("paged, GQA, chunked prefill matches contiguous causal attention", "[attention]") {
  ThreadPool pool(2);
  const int64_t heads = 6, kv_heads = 2, hd = 16, block_size = 4, num_blocks = 12;
  // Sequence A: 11 tokens cached, a chunk of 5 new ones (context 16).
  // Sequence B: a decode step at context 7. Scattered, non-monotonic blocks.
  const int64_t len_a = 16, q_a = 5, len_b = 7;
  std::vector<int32_t> table_a = {9, 2, 7, 0}, table_b = {5, 11};
  std::vector<float> k_a = Random(len_a * kv_heads * hd, 10),
                     v_a = Random(len_a * kv_heads * hd, 11);
  std::vector<float> k_b = Random(len_b * kv_heads * hd, 12),
                     v_b = Random(len_b * kv_heads * hd, 13);
  std::vector<float> kp = Page(k_a, len_a, kv_heads * hd, table_a, block_size, num_blocks);
  std::vector<float> vp = Page(v_a, len_a, kv_heads * hd, table_a, block_size, num_blocks);
  std::vector<float> kb = Page(k_b, len_b, kv_heads * hd, table_b, block_size, num_blocks);
  std::vector<float> vb = Page(v_b, len_b, kv_heads * hd, table_b, block_size, num_blocks);
  for (int64_t s : {5, 11}) {  // merge B's blocks into the shared buffers
    const int64_t off = s * block_size * kv_heads * hd, n = block_size * kv_heads * hd;
    std::memcpy(&kp[off], &kb[off], n * sizeof(float));
    std::memcpy(&vp[off], &vb[off], n * sizeof(float));
  }
  const int64_t rows = q_a + 1;
  std::vector<float> q = Random(rows * heads * hd, 14), out(rows * heads * hd);
  PagedKvLayer kv{kp.data(), vp.data(), block_size, kv_heads, hd};
  const float scale = 0.25f;
  PagedAttention(pool, q.data(), heads, kv,
                 {{0, q_a, len_a, table_a.data()}, {q_a, 1, len_b, table_b.data()}}, scale,
                 out.data());
  std::vector<float> q_part_a(q.begin(), q.begin() + q_a * heads * hd);
  std::vector<float> q_part_b(q.begin() + q_a * heads * hd, q.end());
  std::vector<double> ref_a = Reference(q_part_a, k_a, v_a, q_a, len_a, heads, kv_heads, hd, scale);
  std::vector<double> ref_b = Reference(q_part_b, k_b, v_b, 1, len_b, heads, kv_heads, hd, scale);
  double worst = 0;
  for (size_t i = 0; i < ref_a.size(); ++i) worst = std::max(worst, std::fabs(ref_a[i] - out[i]));
  for (size_t i = 0; i < ref_b.size(); ++i) {
    worst = std::max(worst, std::fabs(ref_b[i] - out[ref_a.size() + i]));
  }
  CHECK(worst < 1e-5);
}

TEST_CASE("every head size, vector or scalar path, matches causal attention", "[attention]") {
  ThreadPool pool(2);
  // 8..128 take the 8-keys-at-a-time vector path, 24 the scalar one; 37
  // keys leave a partial last group of 8 and a partial last block.
  for (int64_t hd : {8, 16, 24, 32, 64, 128}) {
    const int64_t heads = 4, kv_heads = 2, block_size = 4, len = 37, num_blocks = 10;
    std::vector<int32_t> table = {3, 9, 0, 7, 1, 8, 2, 6, 4, 5};
    std::vector<float> k = Random(len * kv_heads * hd, 20 + hd),
                       v = Random(len * kv_heads * hd, 21);
    std::vector<float> kp = Page(k, len, kv_heads * hd, table, block_size, num_blocks);
    std::vector<float> vp = Page(v, len, kv_heads * hd, table, block_size, num_blocks);
    std::vector<float> q = Random(len * heads * hd, 22), out(len * heads * hd);
    PagedKvLayer kv{kp.data(), vp.data(), block_size, kv_heads, hd};
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    PagedAttention(pool, q.data(), heads, kv, {{0, len, len, table.data()}}, scale, out.data());
    std::vector<double> ref = Reference(q, k, v, len, len, heads, kv_heads, hd, scale);
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(ref[i] - out[i]));
    INFO("head_dim " << hd);
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("a row's attention output does not depend on the other rows", "[attention]") {
  ThreadPool pool(2);
  const int64_t heads = 4, kv_heads = 1, hd = 8, block_size = 2, len = 9;
  std::vector<int32_t> table = {4, 0, 3, 1, 2};
  std::vector<float> k = Page(Random(len * hd, 1), len, hd, table, block_size, 5);
  std::vector<float> v = Page(Random(len * hd, 2), len, hd, table, block_size, 5);
  PagedKvLayer kv{k.data(), v.data(), block_size, kv_heads, hd};
  std::vector<float> q = Random(len * heads * hd, 3), all(len * heads * hd), last(heads * hd);
  PagedAttention(pool, q.data(), heads, kv, {{0, len, len, table.data()}}, 0.35f, all.data());
  PagedAttention(pool, &q[(len - 1) * heads * hd], heads, kv, {{0, 1, len, table.data()}}, 0.35f,
                 last.data());
  CHECK(std::memcmp(last.data(), &all[(len - 1) * heads * hd], heads * hd * sizeof(float)) == 0);
}

// A causal cache of `len` random tokens over a shuffled block table, with
// random queries for every position: the fixture of the tiling tests below.
struct Fixture {
  int64_t heads, kv_heads, hd, block_size, len;
  std::vector<int32_t> table;
  std::vector<float> k, v, kp, vp, q;

  Fixture(int64_t heads_, int64_t kv_heads_, int64_t hd_, int64_t block_size_, int64_t len_,
          uint32_t seed)
      : heads(heads_), kv_heads(kv_heads_), hd(hd_), block_size(block_size_), len(len_) {
    const int64_t blocks = (len + block_size - 1) / block_size + 3;  // some never used
    table.resize(blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(seed));
    k = Random(len * kv_heads * hd, seed);
    v = Random(len * kv_heads * hd, seed + 1);
    kp = Page(k, len, kv_heads * hd, table, block_size, blocks);
    vp = Page(v, len, kv_heads * hd, table, block_size, blocks);
    q = Random(len * heads * hd, seed + 2);
  }
  PagedKvLayer Layer() const { return {kp.data(), vp.data(), block_size, kv_heads, hd}; }
  int64_t RowFloats() const { return heads * hd; }
  float Scale() const { return 1.0f / std::sqrt(static_cast<float>(hd)); }
  // Rows [first, len) as one chunk whose earlier keys are already cached.
  std::vector<float> Chunk(ThreadPool& pool, int64_t first) const {
    std::vector<float> out((len - first) * RowFloats());
    PagedAttention(pool, &q[first * RowFloats()], heads, Layer(),
                   {{0, len - first, len, table.data()}}, Scale(), out.data());
    return out;
  }
};

TEST_CASE("every prefill row is bitwise the row decoded alone, for every tiling", "[attention]") {
  ThreadPool pool(2);
  // Groups of 1, 3, 7 (Qwen2-0.5B) and 6 (Qwen2-VL-2B) query heads per KV
  // head give tiles of 28, 9, 4 and 4 rows; lengths leave partial tiles,
  // partial groups of 8 keys and partial 32-key value blocks; block sizes
  // 5 and 16 put block edges inside and on the groups of 8; head_dim 24
  // takes the scalar path.
  struct Shape {
    int64_t heads, kv_heads, hd, block_size, len;
  };
  for (const Shape& s : {Shape{4, 4, 8, 5, 37}, Shape{6, 2, 16, 16, 45}, Shape{14, 2, 64, 16, 70},
                         Shape{12, 2, 128, 5, 23}, Shape{6, 2, 32, 4, 33}, Shape{4, 2, 24, 5, 19},
                         Shape{7, 1, 64, 16, 9}}) {
    INFO("heads " << s.heads << " kv_heads " << s.kv_heads << " head_dim " << s.hd << " len "
                  << s.len);
    const Fixture f(s.heads, s.kv_heads, s.hd, s.block_size, s.len, 40 + s.hd);
    const std::vector<float> all = f.Chunk(pool, 0);
    std::vector<float> one(f.RowFloats());
    int64_t differing = 0;
    for (int64_t i = 0; i < s.len; ++i) {
      PagedAttention(pool, &f.q[i * f.RowFloats()], s.heads, f.Layer(),
                     {{0, 1, i + 1, f.table.data()}}, f.Scale(), one.data());
      differing +=
          std::memcmp(one.data(), &all[i * f.RowFloats()], one.size() * sizeof(float)) != 0;
    }
    CHECK(differing == 0);
    // And the result is attention, not merely self-consistent.
    const std::vector<double> ref =
        Reference(f.q, f.k, f.v, s.len, s.len, s.heads, s.kv_heads, s.hd, f.Scale());
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(ref[i] - all[i]));
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("a chunk after cached context gives bitwise the rows of one prefill", "[attention]") {
  ThreadPool pool(2);
  const Fixture f(14, 2, 64, 16, 75, 7);
  const std::vector<float> all = f.Chunk(pool, 0);
  // Chunks starting inside a tile, on a block edge, inside a group of 8.
  for (int64_t first : {1, 16, 29, 61, 74}) {
    INFO("chunk from row " << first);
    const std::vector<float> chunk = f.Chunk(pool, first);
    CHECK(std::memcmp(chunk.data(), &all[first * f.RowFloats()], chunk.size() * sizeof(float)) ==
          0);
  }
}

TEST_CASE("rows of a mixed batch are bitwise those of each sequence alone", "[attention]") {
  ThreadPool pool(2);
  // Two sequences in one cache: B's blocks follow A's. A prefills a chunk of
  // 30 after 12 cached tokens; B decodes one token at context 50.
  const int64_t heads = 14, kv_heads = 2, hd = 64, block_size = 16;
  const Fixture a(heads, kv_heads, hd, block_size, 42, 100);
  const Fixture b(heads, kv_heads, hd, block_size, 50, 200);
  const int64_t width = block_size * kv_heads * hd;
  const int64_t a_blocks = static_cast<int64_t>(a.kp.size()) / width;
  std::vector<float> kp = a.kp, vp = a.vp;
  kp.insert(kp.end(), b.kp.begin(), b.kp.end());
  vp.insert(vp.end(), b.vp.begin(), b.vp.end());
  std::vector<int32_t> b_table = b.table;
  for (int32_t& block : b_table) block += static_cast<int32_t>(a_blocks);
  const int64_t row = heads * hd, a_rows = 30;
  std::vector<float> q(a.q.end() - a_rows * row, a.q.end());
  q.insert(q.end(), b.q.end() - row, b.q.end());
  std::vector<float> out(q.size());
  const PagedKvLayer kv{kp.data(), vp.data(), block_size, kv_heads, hd};
  PagedAttention(pool, q.data(), heads, kv,
                 {{0, a_rows, 42, a.table.data()}, {a_rows, 1, 50, b_table.data()}}, a.Scale(),
                 out.data());
  const std::vector<float> alone_a = a.Chunk(pool, 42 - a_rows), alone_b = b.Chunk(pool, 49);
  CHECK(std::memcmp(out.data(), alone_a.data(), alone_a.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(&out[a_rows * row], alone_b.data(), alone_b.size() * sizeof(float)) == 0);
}

TEST_CASE("every ISA level gives bitwise the same attention", "[attention]") {
  ThreadPool pool(2);
  // The AVX-512 weighing takes head_dim 16, 32, 64 and 128; partial tiles
  // of 6 queries, partial value blocks and chunks after cached context
  // included; head_dim 8 and 24 stay on AVX2 and the scalar path at every
  // level.
  struct Shape {
    int64_t heads, kv_heads, hd, block_size, len, first;
  };
  for (const Shape& s :
       {Shape{6, 2, 16, 16, 45, 0}, Shape{14, 2, 64, 16, 70, 0}, Shape{14, 2, 64, 16, 75, 29},
        Shape{12, 2, 128, 5, 23, 0}, Shape{6, 2, 32, 4, 33, 7}, Shape{7, 1, 64, 16, 9, 8},
        Shape{3, 1, 64, 16, 41, 0}, Shape{4, 4, 8, 5, 37, 0}, Shape{4, 2, 24, 5, 19, 0}}) {
    INFO("heads " << s.heads << " kv_heads " << s.kv_heads << " head_dim " << s.hd << " len "
                  << s.len << " from row " << s.first);
    const Fixture f(s.heads, s.kv_heads, s.hd, s.block_size, s.len, 70 + s.hd);
    std::vector<std::vector<float>> outs;
    for (CpuIsa isa : SupportedCpuIsas()) {
      const ScopedCpuIsa level(isa);
      outs.push_back(f.Chunk(pool, s.first));
    }
    for (size_t i = 1; i < outs.size(); ++i) {
      CHECK(std::memcmp(outs[i].data(), outs[0].data(), outs[0].size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace
}  // namespace mmserve::model::cpu
