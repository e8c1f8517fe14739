// KvExchange among the members of one prefill group that run as threads of
// one process (tests; the UCX exchange between processes is in worker/).
//
//   InProcessKvGroup group(/*members=*/2, cfg.num_hidden_layers, prompt_len,
//                          kv_heads * head_dim, absl::Seconds(10));
//   // thread m:
//   model_m.ForwardElasticPrefill(batch_m, kv_m, group.member(m), &logits_m);
//
// Per layer each member copies its rows into the layer's shared [prompt_len]
// [kv_width] buffers and waits until every member has; the buffers are
// read-only from then on, so the pointers AllGather returns stay valid for
// the group's life. Every layer has its own buffers (layers x prompt x
// kv_width x 2 floats): simple, and fine at test sizes. A wait past the
// timeout aborts the group (DEADLINE_EXCEEDED); Abort() ends every wait with
// UNAVAILABLE; rows that do not cover the prompt exactly once end the layer
// with INTERNAL for every member.
// Thread-safety: member(m) from one thread per m at a time; the group is
// safe to share.
#ifndef MMSERVE_MODEL_ELASTIC_LOCAL_EXCHANGE_H_
#define MMSERVE_MODEL_ELASTIC_LOCAL_EXCHANGE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "model/elastic.h"

namespace mmserve::model {

class InProcessKvGroup {
 public:
  InProcessKvGroup(int members, int num_layers, int64_t prompt_len, int64_t kv_width,
                   absl::Duration timeout);
  ~InProcessKvGroup();
  InProcessKvGroup(const InProcessKvGroup&) = delete;
  InProcessKvGroup& operator=(const InProcessKvGroup&) = delete;

  KvExchange& member(int m);

 private:
  class Member;
  absl::Status AllGather(int layer, absl::Span<const int64_t> rows, const float* k, const float* v,
                         const float** k_all, const float** v_all);
  void Abort();

  const int num_members_;
  const int64_t prompt_len_, kv_width_;
  const absl::Duration timeout_;
  std::vector<std::unique_ptr<Member>> members_;
  absl::Mutex mu_;
  // Written under mu_ until the layer's last member arrives, read-only after.
  std::vector<std::vector<float>> k_, v_;
  std::vector<int> arrived_ ABSL_GUARDED_BY(mu_);                // members, per layer
  std::vector<int64_t> rows_seen_ ABSL_GUARDED_BY(mu_);          // rows written, per layer
  std::vector<std::vector<bool>> written_ ABSL_GUARDED_BY(mu_);  // per layer and row
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  bool overlap_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_ELASTIC_LOCAL_EXCHANGE_H_
