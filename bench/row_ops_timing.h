// The decoder's memory-bound row ops (RMSNorm, RoPE's rotation, SiLU*mul)
// at a prefill's shapes (and the vision tower's LayerNorm and RoPE), timed at each kernel level
// (model/cpu/cpu_isa.h) beside a copy of the same bytes: the bandwidth ceiling they are held to.
//
//   std::vector<RowOpTiming> t = TimeRowOps(pool, cfg, /*rows=*/512, /*reps=*/5);
//   double vs_copy = t[0].copy_s / t[0].level_s[1];  // 1.0: at copy speed
//
// bytes counts what an op reads and writes (STREAM convention); the copy
// moves the same bytes (bytes / 2 read, bytes / 2 written) over the same
// threads (the pool for RMSNorm and SiLU*mul, which the model runs on it;
// the calling thread for RoPE, which it runs there), timed on its second
// pass (warm caches, as each level's op finds them). Each figure is the
// best of `reps`, the copy and the levels interleaved so they see the same
// load. Not thread-safe (uses the pool; sets the level for the duration).
#ifndef MMSERVE_BENCH_ROW_OPS_TIMING_H_
#define MMSERVE_BENCH_ROW_OPS_TIMING_H_

#include <cstdint>
#include <vector>

#include "model/cpu/thread_pool.h"
#include "model/model_config.h"

namespace mmserve::bench {

struct RowOpTiming {
  const char* name;  // "rmsnorm", "rope", "silu_mul"
  double bytes = 0;
  double level_s[2] = {0, 0};  // kAvx2, kAvx512 (0: the CPU lacks it)
  double copy_s = 0;
};

std::vector<RowOpTiming> TimeRowOps(model::cpu::ThreadPool& pool, const model::TextConfig& cfg,
                                    int64_t rows, int reps);

// The vision tower's row ops on one thread over `rows` patches (one of its
// row chunks): "layernorm" (LayerNormRows, embed wide) and "vision_rope"
// (RotateHalf over each patch's q and k heads, 2 * heads vectors of
// embed / heads), each beside a copy on the calling thread.
std::vector<RowOpTiming> TimeVisionRowOps(int64_t rows, int embed, int heads, int reps);

}  // namespace mmserve::bench

#endif  // MMSERVE_BENCH_ROW_OPS_TIMING_H_
