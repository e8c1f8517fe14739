// The elastic manager's decisions for requests already decoding (after
// LoongServe's scale-up): per iteration, each decoding request's master
// reserves only the next window of its decode KV; when the master's free
// blocks cannot hold that window, the request's chain is extended with a new
// master on an instance that can (the old master decodes to the end of what
// it reserved, then hands over with a master move: its KV stays where it is
// as a held span, none is copied); and a master moves when another instance
// would decode the request faster by a margin. One pure decision; the
// router does not act on it yet: it places masters that reserve their
// whole decode range (a plan's decode_window makes a master grow its span
// a window at a time instead; docs/elastic.md, "Growing a decoding
// request").
//
//   ElasticGrowthState s;   // instances (free blocks, ordinary decode batch),
//                           // decoding requests (master, holders, KV, reservation)
//   ElasticGrowthConfig c;  // block size, lookahead, decode step model, margin
//   for (const ElasticGrowthAction& a : PlanElasticGrowth(s, c)) {
//     // kReserve: the master holds [begin, end) more; kExtend / kMove: a new
//     // master holds [begin, end) and takes over at begin; kOutOfKv: end
//     // the request RESOURCE_EXHAUSTED (as running out of KV ends it).
//   }
//
// The window a request needs is its next `lookahead_steps` tokens, or more
// when its decode rate would write more than that while an extension gets
// ready (extend_seconds), and never more than it may still generate.
// Requests are taken in order of urgency (the fewest seconds until their
// reservation is full first), each claiming free blocks before the next.
//
// The decode step model prices a master's round: an instance runs one step
// for its ordinary batch and one per set of span holders it masters
// requests of (a step's span client reaches one set), so a request's time
// per token on a master is the sum of that master's step times.
// Thread-safe (pure functions).
#ifndef MMSERVE_SCHEDULER_ELASTIC_GROWTH_H_
#define MMSERVE_SCHEDULER_ELASTIC_GROWTH_H_

#include <cstdint>
#include <vector>

namespace mmserve::scheduler {

// One decode step of a master over one set of span holders, in seconds:
// a + per_row x rows decoded + per_kv_token x KV tokens attended on the
// master + per_holder x holders queried (each a round trip per layer).
struct DecodeStepModel {
  double a = 2e-3;
  double per_row = 1e-4;
  double per_kv_token = 2e-8;
  double per_holder = 1e-3;
  double Predict(int64_t rows, int64_t kv_tokens, int64_t holders) const {
    return a + per_row * static_cast<double>(rows) + per_kv_token * static_cast<double>(kv_tokens) +
           per_holder * static_cast<double>(holders);
  }
};

// One measured decode step (an instance's load report: its last step's
// batch and step time; a master's step over a set of holders).
struct DecodeStepSample {
  int64_t rows = 0, kv_tokens = 0, holders = 0;
  double seconds = 0;
};
// The non-negative least-squares model over the samples. A term whose
// feature takes one value only in the samples cannot be told from the
// intercept: it keeps `prior`'s coefficient (load reports give rows and
// step times, not KV or holders). No samples: `prior`.
DecodeStepModel FitDecodeStepModel(const std::vector<DecodeStepSample>& samples,
                                   const DecodeStepModel& prior);

struct ElasticGrowthInstance {
  int id = 0;
  int64_t free_blocks = 0;
  // Its ordinary decode batch (requests not spread): one step of these.
  int64_t batch_rows = 0;
  int64_t batch_kv_tokens = 0;
};

// A request whose KV is spread, decoding on its master.
struct ElasticDecodingRequest {
  uint64_t id = 0;
  int master = 0;  // an instance id
  // The other instances with a span of its KV, and how many KV tokens each
  // span holds (parallel vectors).
  std::vector<int> holders;
  std::vector<int64_t> holder_kv_tokens;
  int64_t kv_tokens = 0;         // KV slots written so far, over all spans
  int64_t master_kv_tokens = 0;  // of which on the master
  // The master's reservation ends at this KV index (exclusive): on the
  // grid of its blocks.
  int64_t reserved_end = 0;
  int64_t remaining_tokens = 0;    // it may still generate
  double tokens_per_second = 0;    // its decode rate (0: not measured yet)
  bool next_master_ready = false;  // extended already: its next master waits
};

struct ElasticGrowthState {
  std::vector<ElasticGrowthInstance> instances;
  std::vector<ElasticDecodingRequest> requests;
};

struct ElasticGrowthConfig {
  int64_t block_size = 16;
  int64_t lookahead_steps = 32;
  // How long an extension takes to be ready (the calls to the new master
  // and the holders).
  double extend_seconds = 0.05;
  // A move needs the new master's time per token below (1 - margin) of the
  // old one's, and the time it saves over the tokens left above
  // extend_seconds.
  double move_margin = 0.2;
  DecodeStepModel decode;
};

struct ElasticGrowthAction {
  enum class Kind : uint8_t {
    kReserve,  // the master reserves [begin, end) more
    kExtend,   // a new master reserves [begin, end); the old one stops at begin
    kMove,     // as kExtend, for speed: the old master's reservation past begin is freed
    kOutOfKv,  // no slot for its next token anywhere: the request ends
  };
  Kind kind = Kind::kReserve;
  uint64_t id = 0;
  int instance = 0;  // where [begin, end) is reserved (the master for kReserve)
  int64_t begin = 0, end = 0;
};

// The KV tokens request `r` needs reserved past what it wrote.
int64_t GrowthWindow(const ElasticDecodingRequest& r, const ElasticGrowthConfig& config);

// A request's seconds per token on `instance` of `state`, were it
// mastered there (its holders then being `holders`, with
// `master_kv_tokens` of its KV on the instance); the request itself must
// not be counted in the state's steps of that instance.
double SecondsPerToken(const ElasticGrowthState& state, int instance, uint64_t exclude,
                       const std::vector<int>& holders, int64_t master_kv_tokens,
                       const DecodeStepModel& model);

// Every decision of this iteration; requests needing none are left out.
std::vector<ElasticGrowthAction> PlanElasticGrowth(const ElasticGrowthState& state,
                                                   const ElasticGrowthConfig& config);

}  // namespace mmserve::scheduler

#endif  // MMSERVE_SCHEDULER_ELASTIC_GROWTH_H_
