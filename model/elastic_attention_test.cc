// Split attention for elastic sequence parallelism (model/cpu/split_attention.h)
// against single-instance PagedAttention, with M-RoPE positions of an image
// prompt applied per member.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "model/cpu/paged_attention.h"
#include "model/cpu/split_attention.h"
#include "model/rope.h"

namespace mmserve::model {
namespace {

using cpu::GatheredKv;
using cpu::PagedKvLayer;
using cpu::ThreadPool;

std::vector<float> Random(int64_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// M-RoPE positions [3][len] of a prompt: 5 text tokens, a 1 x 4 x 6 image
// (24 rows sharing t = 5), then text from 11 on: equal t and jumps, so a
// mask by position would differ from the mask by index.
std::vector<int64_t> ImagePromptPositions(int64_t len) {
  std::vector<int64_t> pos(3 * len);
  for (int64_t i = 0; i < len; ++i) {
    int64_t t, h, w;
    if (i < 5) {
      t = h = w = i;
    } else if (i < 29) {
      t = 5;
      h = 5 + (i - 5) / 6;
      w = 5 + (i - 5) % 6;
    } else {
      t = h = w = 11 + (i - 29);
    }
    pos[i] = t;
    pos[len + i] = h;
    pos[2 * len + i] = w;
  }
  return pos;
}

// The rows' positions out of a [3][len] table.
std::vector<int64_t> PositionsOf(const std::vector<int64_t>& all, int64_t len,
                                 const std::vector<int64_t>& rows) {
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<int64_t> pos(3 * n);
  for (int c = 0; c < 3; ++c) {
    for (int64_t i = 0; i < n; ++i) pos[c * n + i] = all[c * len + rows[i]];
  }
  return pos;
}

std::vector<float> RowsOf(const std::vector<float>& all, int64_t width,
                          const std::vector<int64_t>& rows) {
  std::vector<float> out(rows.size() * width);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(&out[i * width], &all[rows[i] * width], width * sizeof(float));
  }
  return out;
}

struct Prompt {
  int64_t len, heads, kv_heads, hd;
  std::vector<float> q, k, v;  // before RoPE, [len][...]
  std::vector<int64_t> pos;
  MRope rope;
  Prompt(int64_t len_, int64_t heads_, int64_t kv_heads_, int64_t hd_, uint32_t seed)
      : len(len_),
        heads(heads_),
        kv_heads(kv_heads_),
        hd(hd_),
        q(Random(len_ * heads_ * hd_, seed)),
        k(Random(len_ * kv_heads_ * hd_, seed + 1)),
        v(Random(len_ * kv_heads_ * hd_, seed + 2)),
        pos(ImagePromptPositions(len_)),
        rope(static_cast<int>(hd_), 10000.0, Section(static_cast<int>(hd_))) {}
  static std::vector<int> Section(int hd) {
    return {hd / 8, hd / 8 + hd / 16, hd / 2 - hd / 4 - hd / 16};
  }
  float Scale() const { return 1.0f / std::sqrt(static_cast<float>(hd)); }
};

// One instance: RoPE over every row, K/V paged through a shuffled block
// table, one prefill sequence.
std::vector<float> SingleInstance(ThreadPool& pool, const Prompt& p) {
  std::vector<float> q = p.q, k = p.k;
  RopeAngles angles;
  p.rope.ComputeAngles(p.pos.data(), p.len, &angles);
  p.rope.Apply(angles, q.data(), p.len, p.heads);
  p.rope.Apply(angles, k.data(), p.len, p.kv_heads);
  const int64_t bs = 4, blocks = (p.len + bs - 1) / bs, width = p.kv_heads * p.hd;
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));
  std::vector<float> kp(blocks * bs * width, NAN), vp(blocks * bs * width, NAN);
  for (int64_t j = 0; j < p.len; ++j) {
    const int64_t slot = table[j / bs] * bs + j % bs;
    std::memcpy(&kp[slot * width], &k[j * width], width * sizeof(float));
    std::memcpy(&vp[slot * width], &p.v[j * width], width * sizeof(float));
  }
  std::vector<float> out(p.len * p.heads * p.hd);
  cpu::PagedAttention(pool, q.data(), p.heads, {kp.data(), vp.data(), bs, p.kv_heads, p.hd},
                      {{0, p.len, p.len, table.data()}}, p.Scale(), out.data());
  return out;
}

// P members: each applies RoPE to its own rows with their own positions,
// "sends" its K rows into the gathered buffer at their global indices, then
// attends its rows over the gathered K/V. Returns the outputs in global order.
std::vector<float> Split(ThreadPool& pool, const Prompt& p,
                         const std::vector<std::vector<int64_t>>& members) {
  const int64_t qw = p.heads * p.hd, kw = p.kv_heads * p.hd;
  std::vector<float> k_all(p.len * kw, NAN);
  std::vector<std::vector<float>> qs;
  for (const std::vector<int64_t>& rows : members) {
    const int64_t n = static_cast<int64_t>(rows.size());
    std::vector<float> q = RowsOf(p.q, qw, rows), k = RowsOf(p.k, kw, rows);
    const std::vector<int64_t> pos = PositionsOf(p.pos, p.len, rows);
    RopeAngles angles;
    p.rope.ComputeAngles(pos.data(), n, &angles);
    p.rope.Apply(angles, q.data(), n, p.heads);
    p.rope.Apply(angles, k.data(), n, p.kv_heads);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(&k_all[rows[i] * kw], &k[i * kw], kw * sizeof(float));
    }
    qs.push_back(std::move(q));
  }
  std::vector<float> out(p.len * qw, NAN);
  for (size_t m = 0; m < members.size(); ++m) {
    const std::vector<int64_t>& rows = members[m];
    std::vector<float> o(rows.size() * qw);
    cpu::SplitPrefillAttention(pool, qs[m].data(), p.heads,
                               GatheredKv{k_all.data(), p.v.data(), p.len, p.kv_heads, p.hd}, rows,
                               p.Scale(), o.data());
    for (size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(&out[rows[i] * qw], &o[i * qw], qw * sizeof(float));
    }
  }
  return out;
}

std::vector<int64_t> Range(int64_t begin, int64_t end) {
  std::vector<int64_t> r(end - begin);
  std::iota(r.begin(), r.end(), begin);
  return r;
}

TEST_CASE("split prefill over 2 and 3 members is bitwise single-instance attention",
          "[elastic][attention]") {
  ThreadPool pool(2);
  struct Shape {
    int64_t heads, kv_heads, hd, len;
  };
  for (const Shape& s : {Shape{4, 2, 16, 41}, Shape{14, 2, 64, 45}, Shape{6, 2, 24, 37}}) {
    INFO("heads " << s.heads << " head_dim " << s.hd << " len " << s.len);
    const Prompt p(s.len, s.heads, s.kv_heads, s.hd, 11);
    const std::vector<float> single = SingleInstance(pool, p);
    std::vector<int64_t> stripe[3];
    for (int64_t i = 0; i < s.len; ++i) stripe[i % 3].push_back(i);
    // Contiguous ranges cutting through the image, 3 uneven ranges, and
    // LoongServe's stripes (every row its own run).
    const std::vector<std::vector<std::vector<int64_t>>> plans = {
        {Range(0, 17), Range(17, s.len)},
        {Range(0, 3), Range(3, 30), Range(30, s.len)},
        {stripe[0], stripe[1], stripe[2]},
    };
    for (size_t i = 0; i < plans.size(); ++i) {
      INFO("plan " << i);
      const std::vector<float> split = Split(pool, p, plans[i]);
      CHECK(std::memcmp(split.data(), single.data(), single.size() * sizeof(float)) == 0);
    }
  }
}

// A decode row's keys: len keys paged through a shuffled table, values of
// standard deviation 1, scores spread by sd.
struct DecodeCase {
  int64_t heads, kv_heads, hd, bs = 4, len;
  std::vector<int32_t> table;
  std::vector<float> kp, vp, q;
  DecodeCase(int64_t heads_, int64_t kv_heads_, int64_t hd_, int64_t len_, uint32_t seed)
      : heads(heads_), kv_heads(kv_heads_), hd(hd_), len(len_) {
    const int64_t blocks = (len + bs - 1) / bs, width = kv_heads * hd;
    table.resize(blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(seed));
    kp = Random(blocks * bs * width, seed + 1, 2.0f);
    vp = Random(blocks * bs * width, seed + 2);
    q = Random(heads * hd, seed + 3);
  }
  PagedKvLayer Layer() const { return {kp.data(), vp.data(), bs, kv_heads, hd}; }
  float Scale() const { return 1.0f / std::sqrt(static_cast<float>(hd)); }
  float MaxAbsValue() const {
    float m = 0;
    for (float x : vp) m = std::max(m, std::fabs(x));
    return m;
  }
};

// The bound on |merged - single| per element, from the arithmetic (u =
// 2^-24, V = max |v|, n keys in a span, N in all, P spans, L = max |lse|,
// e = 2e-7 the exponential's relative error, documented ~1e-7):
// - Scores are the same bits on both sides (same per-key arithmetic).
// - A softmax over n keys with max M: x = s - M rounds by u|x| with |x| <=
//   87.3 (below, e^x is 0 in both), e^x by e; the sum by (n/8 + 3)u (8 lane
//   chains and a 3-level tree); 1/sum and the product by 2u. So each weight
//   is the exact p_j (1 + t_j) with |t_j| <= 2(e + 88u) + (n/8 + 5)u = T(n),
//   and the FMA chain over the keys adds n u V: |o_span - exact| <= V (T(n)
//   + n u). The same holds for one instance with n = N.
// - lse = M + log(sum) is off by (e + 88u + (N/8 + 3)u) + 2uL; each merge
//   weight e^(lse - m) then by W = 2 that + 2uL + u relatively; moving the
//   weights of a convex combination of values by W moves it by <= 2WV; the
//   weight sum, the P-term FMA chain and the division add (2P + 1)uV.
double MergeBound(int64_t n, int64_t p, double lse_max, double v_max) {
  const double u = std::ldexp(1.0, -24), e = 2e-7;
  const double t = 2 * (e + 88 * u) + (n / 8.0 + 5) * u;
  const double lse_err = e + 88 * u + (n / 8.0 + 3) * u + 2 * u * lse_max;
  const double w = 2 * lse_err + 2 * u * lse_max + u;
  return v_max * ((t + n * u) * 2 + 2 * w + (2 * p + 1) * u);
}

TEST_CASE("one span holding every key merges to PagedAttention's bits", "[elastic][attention]") {
  ThreadPool pool(2);
  for (int64_t hd : {8, 16, 64, 128}) {
    INFO("head_dim " << hd);
    const DecodeCase c(14, 2, hd, 77, 5);
    std::vector<float> single(c.heads * hd), o(c.heads * hd), lse(c.heads), merged(c.heads * hd);
    cpu::PagedAttention(pool, c.q.data(), c.heads, c.Layer(), {{0, 1, c.len, c.table.data()}},
                        c.Scale(), single.data());
    cpu::PartialAttention(pool, c.q.data(), c.heads, c.Layer(), {{0, c.table.data(), c.len}},
                          c.Scale(), o.data(), lse.data());
    CHECK(std::memcmp(o.data(), single.data(), o.size() * sizeof(float)) == 0);
    const std::vector<float> empty_o(c.heads * hd, 0.0f), empty_lse(c.heads, -INFINITY);
    const cpu::PartialRef parts[] = {{empty_o.data(), empty_lse.data()}, {o.data(), lse.data()}};
    cpu::MergePartials(c.heads, hd, parts, merged.data());
    CHECK(std::memcmp(merged.data(), single.data(), merged.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("decode merged over 2 and 3 spans is within the derived bound", "[elastic][attention]") {
  ThreadPool pool(2);
  for (int64_t hd : {16, 64, 24}) {
    const DecodeCase c(14, 2, hd, 203, 9);
    std::vector<float> single(c.heads * hd);
    cpu::PagedAttention(pool, c.q.data(), c.heads, c.Layer(), {{0, 1, c.len, c.table.data()}},
                        c.Scale(), single.data());
    // Span boundaries on blocks (the holder's table is a slice of the
    // whole one); an empty span among them.
    for (const std::vector<int64_t>& cuts :
         {std::vector<int64_t>{0, 100, 203}, std::vector<int64_t>{0, 48, 48, 160, 203}}) {
      const int64_t spans = static_cast<int64_t>(cuts.size()) - 1;
      INFO("head_dim " << hd << " spans " << spans);
      std::vector<std::vector<float>> o(spans, std::vector<float>(c.heads * hd));
      std::vector<std::vector<float>> lse(spans, std::vector<float>(c.heads));
      std::vector<cpu::PartialRef> parts;
      double lse_max = 0;
      for (int64_t s = 0; s < spans; ++s) {
        const int32_t* table = c.table.data() + cuts[s] / c.bs;
        cpu::PartialAttention(pool, c.q.data(), c.heads, c.Layer(),
                              {{0, table, cuts[s + 1] - cuts[s]}}, c.Scale(), o[s].data(),
                              lse[s].data());
        for (float x : lse[s]) {
          if (std::isfinite(x)) lse_max = std::max<double>(lse_max, std::fabs(x));
        }
        parts.push_back({o[s].data(), lse[s].data()});
      }
      std::vector<float> merged(c.heads * hd);
      cpu::MergePartials(c.heads, hd, parts, merged.data());
      double worst = 0;
      for (size_t i = 0; i < merged.size(); ++i) {
        worst = std::max<double>(worst, std::fabs(merged[i] - single[i]));
      }
      const double bound = MergeBound(c.len, spans, lse_max, c.MaxAbsValue());
      INFO("worst " << worst << " bound " << bound);
      CHECK(worst <= bound);
    }
  }
}

TEST_CASE("a row whose every span is empty merges to zero, never NaN", "[elastic][attention]") {
  ThreadPool pool(1);
  const DecodeCase c(4, 2, 16, 8, 3);
  std::vector<float> o(c.heads * c.hd, 1.0f), lse(c.heads, 0.0f), merged(c.heads * c.hd, NAN);
  cpu::PartialAttention(pool, c.q.data(), c.heads, c.Layer(), {{0, c.table.data(), 0}}, c.Scale(),
                        o.data(), lse.data());
  for (float x : lse) CHECK(x == -INFINITY);
  for (float x : o) CHECK(x == 0.0f);
  const cpu::PartialRef parts[] = {{o.data(), lse.data()}, {o.data(), lse.data()}};
  cpu::MergePartials(c.heads, c.hd, parts, merged.data());
  for (float x : merged) CHECK(x == 0.0f);
}

}  // namespace
}  // namespace mmserve::model
