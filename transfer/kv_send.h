// The wire operations of one KV hand-off on the sender's progress thread
// (KvHandoffSender's internals): segments as puts + a flush (a head-sliced
// target), or as active messages that a KvLandingPad lands and answers
// (every other target the sender cannot map; see kv_landing.h).
//
//   auto state = std::make_shared<KvSendState>();
//   StartKvMessages(plan, state);  // progress thread; state->done later
//
// Progress thread only, but `done` and `result` (see KvSendState).
#ifndef MMSERVE_TRANSFER_KV_SEND_H_
#define MMSERVE_TRANSFER_KV_SEND_H_

#include <ucp/api/ucp.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "transfer/kv_segments.h"

namespace mmserve::transfer {

// One hand-off's outcome: settles at the first error, or when `remaining`
// completions arrived without one.
struct KvSendState {
  int remaining = 0;     // progress thread
  bool settled = false;  // progress thread
  absl::Status result;   // written once, before `done` is notified
  absl::Notification done;
  void Complete(const absl::Status& status);
};

struct KvSendPlan {
  const std::vector<KvSegment>& segments;
  const uint8_t* base;   // the source cache's first byte
  uint64_t target_base;  // the target cache's first byte, in the target
  ucp_ep_h ep;
  ucp_rkey_h rkey;
  uint64_t sender;  // KvDataHeader's ids
  uint64_t seq;
  size_t in_flight = 1;  // data messages started at once (see KvMessagesInFlight)
};

// Data messages of one hand-off in flight at once, per profile. Measured at
// Qwen2-VL-2B dims under load 12-14 (noisy): tcp 4k tokens (56 messages of
// 4 MiB) all at once 0.44-1.17 of perftest tag_bw, 2-4 at a time 0.87-2.56;
// shm into private memory (1 MiB messages, each a zero-copy read by the
// receiver) 1 at a time 1.36-1.84 GB/s, 4 at a time 1.05-1.07, 16 0.84-0.94.
size_t KvMessagesInFlight(bool tcp);

// A put per segment, then a flush: `state` settles once every put is
// remotely complete.
void StartKvPuts(const KvSendPlan& plan, const std::shared_ptr<KvSendState>& state);
// A data message per segment: `state` expects one completion per message
// and one more, the receiver's landed message (the caller delivers it).
void StartKvMessages(const KvSendPlan& plan, const std::shared_ptr<KvSendState>& state);

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_KV_SEND_H_
