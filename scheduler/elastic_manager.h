// The global manager of elastic sequence parallelism (after
// LoongServe): one pure decision per iteration over a pool of elastic
// instances, for the router to carry out.
//
//   ElasticPoolState s;   // instances (free blocks, decode batch), pending FCFS,
//                     // decoding requests
//   ElasticConfig c;      // block size, prefill-time cap, step-time models
//   ElasticIterationPlan p = PlanElasticIteration(s, c);
//   for (const ElasticBatchPlan& b : p.batches) {
//     // b.instances prefill b.requests together at degree b.instances.size();
//     // each request keeps its spans where the plan says, its master
//     // decodes it afterwards.
//   }
//
// The four steps (docs/elastic.md; the design's rules):
// 1. Dispatch, first-come first-served: take pending requests in order
//    while (a) every taken request's whole future KV (prompt + max new
//    tokens, in blocks) fits the pool's free blocks left after the decoding
//    requests' own future growth, (b) the predicted prefill time stays under
//    the cap (the first request is always allowed, or a long prompt would
//    starve), and (c) when taking it means pausing a decode batch, Cost <=
//    Gain with Cost = T(R_p + r) * sum over the paused batch's requests of
//    1 / output_len and Gain = (avg decode latency - the least time a
//    request of that batch has decoded)^+ / r.input_len (the new request's
//    worst-case wait for that batch, per prompt token). The scan stops at
//    the first refusal.
// 2. Allocation: idle instances first; then instances with decode batches,
//    most free blocks first, while the taken requests' KV does not fit.
// 3. Batching: requests by footprint descending, instances by free blocks
//    descending; f[i][k] = the least sum over batches of T_d(sum of their
//    input lengths) * sum of 1 / input_len (each request's prefill time per
//    prompt token) for the first i requests on the first k instances, each
//    batch a run of requests on a run of d instances whose free blocks hold
//    the run's footprints (d up to the largest degree with a model).
// 4. Retention and masters: inside a batch, each request in order fills the
//    batch's instances most-free first with block-aligned ranges of its
//    future KV; the holder of its last range (which also holds the decode
//    tail) is its master.
// Thread-safe (pure functions).
#ifndef MMSERVE_SCHEDULER_ELASTIC_MANAGER_H_
#define MMSERVE_SCHEDULER_ELASTIC_MANAGER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mmserve::scheduler {

// T(S) = a + b S + c S^2 seconds for a prefill step of S prompt tokens at
// one degree of parallelism (fitted by a profiling benchmark).
struct StepTimeModel {
  double a = 0, b = 0, c = 0;
  double Predict(int64_t tokens) const {
    const double s = static_cast<double>(tokens);
    return a + b * s + c * s * s;
  }
};

// One profiled prefill step: S prompt tokens took `seconds`.
struct StepSample {
  int64_t tokens = 0;
  double seconds = 0;
};
// The non-negative least-squares a, b, c over the samples (the normal
// equations, solved in double): the plain least-squares fit when none of
// its coefficients is negative, else the best fit with some of them held at
// 0 (a model that predicts less time for more tokens, or a negative time,
// would mislead the batching DP). With fewer than 3 distinct token counts,
// c = 0 (and b = 0 with one), so a model always exists for a degree that
// was profiled at all.
StepTimeModel FitStepTimeModel(const std::vector<StepSample>& samples);

struct ElasticConfig {
  int64_t block_size = 16;
  double max_prefill_seconds = 1.0;  // dispatch cap on the predicted prefill step
  // per_degree[d - 1] models a group of d instances; its size is the
  // largest degree the manager forms (at least 1).
  std::vector<StepTimeModel> per_degree;
  double avg_decode_latency = 0;  // seconds a decode-phase request runs, on average
};

struct ElasticInstanceState {
  int id = 0;
  int64_t free_blocks = 0;
  // The instance's decode batch: empty = idle. Output tokens so far of each
  // request it masters, and the least time any of them has spent decoding.
  std::vector<int64_t> decoding_output_lens;
  double min_decode_elapsed_seconds = 0;
  bool idle() const { return decoding_output_lens.empty(); }
};

struct ElasticPendingRequest {
  uint64_t id = 0;
  int64_t input_len = 0;
  int64_t max_new_tokens = 0;
};

struct ElasticPoolState {
  std::vector<ElasticInstanceState> instances;
  std::vector<ElasticPendingRequest> pending;  // arrival order
  // Blocks the decoding requests may still claim (their max_new_tokens not
  // yet generated), pool-wide.
  int64_t decode_growth_blocks = 0;
};

// Tokens [begin, end) of a request's future KV (prompt, then the decode
// tail) kept on one instance.
struct ElasticSpan {
  int instance = 0;
  int64_t begin = 0, end = 0;
};

struct ElasticRequestPlan {
  uint64_t id = 0;
  int64_t input_len = 0;
  std::vector<ElasticSpan> spans;  // ascending, covering [0, input_len + max_new_tokens)
  int master = 0;                  // the instance of the last span
};

struct ElasticBatchPlan {
  std::vector<int> instances;  // the prefill group, in member order
  std::vector<ElasticRequestPlan> requests;
  double predicted_seconds = 0;
};

struct ElasticIterationPlan {
  size_t dispatched = 0;    // pending[0, dispatched) prefill now
  std::vector<int> paused;  // instances whose decode batch waits
  std::vector<ElasticBatchPlan> batches;
  double cost = 0;  // the batching objective of `batches`
};

// Blocks of a request's whole future KV.
int64_t FootprintBlocks(const ElasticPendingRequest& r, int64_t block_size);

// The whole iteration. Requests that cannot be placed stay pending.
ElasticIterationPlan PlanElasticIteration(const ElasticPoolState& state,
                                          const ElasticConfig& config);

// Step 3 alone, for tests and the profiling benchmark: the best batching of
// `requests` on `instances` (both in any order; sorted inside), or no
// batches and cost +inf when they cannot all be placed.
struct ElasticBatching {
  // Per batch: indices into requests and instances.
  std::vector<std::vector<size_t>> requests, instances;
  double cost = 0;
};
ElasticBatching BatchByDp(const std::vector<ElasticPendingRequest>& requests,
                          const std::vector<ElasticInstanceState>& instances,
                          const ElasticConfig& config);

// Step 4 alone: spans and master of each request of one batch, filling
// `instances` most-free first. Requires that the footprints fit.
std::vector<ElasticRequestPlan> PlanRetention(const std::vector<ElasticPendingRequest>& requests,
                                              const std::vector<ElasticInstanceState>& instances,
                                              int64_t block_size);

}  // namespace mmserve::scheduler

#endif  // MMSERVE_SCHEDULER_ELASTIC_MANAGER_H_
