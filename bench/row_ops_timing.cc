#include "bench/row_ops_timing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "common/clock.h"
#include "model/cpu/cpu_isa.h"
#include "model/cpu/ops.h"
#include "model/cpu/rope_ops.h"
#include "model/cpu/vision_ops.h"

namespace mmserve::bench {
namespace {

namespace cpu = model::cpu;

// Copies src to dst (bytes / 2 each way) over the pool, or on the calling
// thread when pool is null.
void Copy(cpu::ThreadPool* pool, const float* src, float* dst, int64_t count) {
  if (pool == nullptr) {
    std::memcpy(dst, src, count * sizeof(float));
    return;
  }
  pool->ParallelFor(count, 16384, [&](int64_t b, int64_t e) {
    std::memcpy(dst + b, src + b, (e - b) * sizeof(float));
  });
}

double Seconds(const std::function<void()>& f) {
  Stopwatch sw;
  f();
  return sw.ElapsedSeconds();
}

// Best of reps of the op at each level and of the copy, interleaved.
void TimeOne(RowOpTiming* t, cpu::ThreadPool* copy_pool, int64_t copy_floats,
             const std::function<void()>& op, int reps) {
  std::vector<float> src(copy_floats, 1.0f), dst(copy_floats);
  const std::vector<cpu::CpuIsa> levels = cpu::SupportedCpuIsas();
  constexpr double kNone = std::numeric_limits<double>::infinity();
  double best[2] = {kNone, kNone}, copy = kNone;
  for (int r = 0; r <= reps; ++r) {  // r == 0 warms up
    // The copy runs twice and the second is timed: its buffers are then as
    // warm in the caches as the op's (which the other level just ran on).
    Copy(copy_pool, src.data(), dst.data(), copy_floats);
    const double c = Seconds([&] { Copy(copy_pool, src.data(), dst.data(), copy_floats); });
    if (r > 0) copy = std::min(copy, c);
    for (cpu::CpuIsa isa : levels) {
      const cpu::ScopedCpuIsa level(isa);
      const double s = Seconds(op);
      if (r > 0) best[static_cast<int>(isa)] = std::min(best[static_cast<int>(isa)], s);
    }
  }
  for (int l = 0; l < 2; ++l) t->level_s[l] = best[l] == kNone ? 0 : best[l];
  t->copy_s = copy;
}

// RoPE's rotation on the calling thread: `vectors` head vectors of hd per
// row over `rows` rows of x, at the rows' own angles.
RowOpTiming TimeRope(const char* name, int64_t rows, int64_t vectors, int hd, float* x, int reps) {
  const int64_t half = hd / 2;
  std::vector<float> cos_t(rows * half), sin_t(rows * half);
  for (size_t i = 0; i < cos_t.size(); ++i) {
    cos_t[i] = std::cos(0.001f * static_cast<float>(i));
    sin_t[i] = std::sin(0.001f * static_cast<float>(i));
  }
  RowOpTiming rope{name};
  rope.bytes = (2.0 * rows * vectors * hd + 2.0 * cos_t.size()) * sizeof(float);
  TimeOne(
      &rope, nullptr, static_cast<int64_t>(rope.bytes / 2 / sizeof(float)),
      [&] {
        cpu::RotateHalf({cos_t.data(), sin_t.data(), rows, vectors, hd}, x);
      },
      reps);
  return rope;
}

}  // namespace

std::vector<RowOpTiming> TimeRowOps(cpu::ThreadPool& pool, const model::TextConfig& cfg,
                                    int64_t rows, int reps) {
  const int64_t hidden = cfg.hidden_size, inter = cfg.intermediate_size;
  const int64_t hd = cfg.head_dim(), heads = cfg.num_attention_heads;
  std::vector<RowOpTiming> out;

  std::vector<float> x(rows * std::max(hidden, inter)), w(hidden, 1.01f), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.01f * static_cast<float>(i));
  RowOpTiming norm{"rmsnorm"};
  norm.bytes = 2.0 * rows * hidden * sizeof(float);
  TimeOne(
      &norm, &pool, rows * hidden,
      [&] { cpu::RmsNorm(pool, x.data(), rows, hidden, w.data(), 1e-6f, y.data()); }, reps);
  out.push_back(norm);

  // The query rows of a layer (the keys are heads / kv_heads times fewer).
  std::vector<float> q(rows * heads * hd, 0.5f);
  out.push_back(TimeRope("rope", rows, heads, static_cast<int>(hd), q.data(), reps));

  std::vector<float> up(rows * inter, 0.75f);
  RowOpTiming silu{"silu_mul"};
  silu.bytes = 3.0 * rows * inter * sizeof(float);
  TimeOne(
      &silu, &pool, static_cast<int64_t>(silu.bytes / 2 / sizeof(float)),
      [&] { cpu::SiluMul(pool, x.data(), up.data(), rows * inter, y.data()); }, reps);
  out.push_back(silu);
  return out;
}

std::vector<RowOpTiming> TimeVisionRowOps(int64_t rows, int embed, int heads, int reps) {
  std::vector<RowOpTiming> out;
  std::vector<float> x(rows * 2 * embed), w(embed, 1.01f), b(embed, 0.01f), y(rows * embed);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.01f * static_cast<float>(i));
  RowOpTiming norm{"layernorm"};
  norm.bytes = 2.0 * rows * embed * sizeof(float);
  TimeOne(
      &norm, nullptr, rows * embed,
      [&] { cpu::LayerNormRows(x.data(), rows, embed, w.data(), b.data(), 1e-6f, y.data()); },
      reps);
  out.push_back(norm);

  // Each patch's q and k heads, as the tower rotates them.
  out.push_back(TimeRope("vision_rope", rows, 2 * heads, embed / heads, x.data(), reps));
  return out;
}

}  // namespace mmserve::bench
