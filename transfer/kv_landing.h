// The KV hand-off's two-sided path, used where the target cache is not
// mapped into the sender (tcp; shm into private memory), since UCX 1.13
// emulates puts there with active messages that land in bounce buffers and
// are copied again: instead each segment (see kv_segments.h) travels as one
// active message whose header says where in the receiver's cache it lands;
// large ones go by rendezvous (ucp_am_recv_data_nbx straight into the
// cache's bytes: zero-copy on shm, the socket read into place on tcp), small
// ones arrive eagerly and are copied in. Once every message of a hand-off
// has landed, the receiver answers on the reply endpoint with a "landed"
// message; the sender's Send returns only after it, so the writes are
// complete (and ran on the receiver's progress thread, which
// KvHandoffReceiver::AwaitLandedWrites then orders before the caller).
//
//   sender -> receiver  kKvAmData   KvDataHeader + segment bytes   (xN)
//   receiver -> sender  kKvAmLanded KvLandedHeader                 (once)
//
// A message that would land outside the cache is refused (its sender's
// operation fails; the landed message says ok = 0). Thread-safety: a
// KvLandingPad lives on its worker's progress thread; every method but the
// constructor runs there.
#ifndef MMSERVE_TRANSFER_KV_LANDING_H_
#define MMSERVE_TRANSFER_KV_LANDING_H_

#include <ucp/api/ucp.h>

#include <cstdint>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "transfer/ucx_worker.h"

namespace mmserve::transfer {

enum KvAmId : uint16_t { kKvAmData = 41, kKvAmLanded = 42 };

struct KvDataHeader {
  uint64_t sender = 0;    // the sending KvHandoffSender's random id
  uint64_t seq = 0;       // its hand-off number
  uint64_t offset = 0;    // where the bytes land: offset in the receiver's cache
  uint32_t messages = 0;  // data messages in this hand-off
  uint32_t reserved = 0;
};

struct KvLandedHeader {
  uint64_t seq = 0;
  uint32_t messages = 0;  // that landed (or were refused)
  uint32_t ok = 0;        // 1: every one landed in range
};

class KvLandingPad {
 public:
  // Lands into [base, base + length), which must outlive the worker's
  // progress (the owner stops the worker before destroying both).
  KvLandingPad(UcxWorker& worker, uint8_t* base, size_t length)
      : worker_(worker), base_(base), length_(length) {}
  KvLandingPad(const KvLandingPad&) = delete;
  KvLandingPad& operator=(const KvLandingPad&) = delete;

  // Sets the kKvAmData handler on the worker.
  [[nodiscard]] absl::Status Register();
  // Forgets every hand-off and refuses further messages (before the worker
  // stops: receives it cancels then must not answer).
  void Close();
  // Whether some hand-off is partly landed or its landed message is still
  // being sent (the progress thread keeps polling then).
  bool active() const { return !landings_.empty() || acks_in_flight_ > 0; }
  // Forgets hand-offs with no message for `idle` (their sender died or gave
  // up); their late messages, if any, still land in range.
  void Expire(absl::Duration idle);

 private:
  using Key = std::pair<uint64_t, uint64_t>;  // sender id, seq
  struct Landing {
    uint32_t expected = 0;
    uint32_t landed = 0;
    bool ok = true;
    ucp_ep_h reply = nullptr;
    absl::Time last;
  };
  static ucs_status_t OnData(void* arg, const void* header, size_t header_length, void* data,
                             size_t length, const ucp_am_recv_param_t* param);
  ucs_status_t Land(const KvDataHeader& h, void* data, size_t length,
                    const ucp_am_recv_param_t& param);
  // One message of `key` landed (or was refused); acks when all did.
  void Landed(const Key& key, bool ok);

  UcxWorker& worker_;
  uint8_t* const base_;
  const size_t length_;
  std::map<Key, Landing> landings_;
  bool closed_ = false;
  // Landed messages not yet sent: UCX 1.13 does not always wake an armed
  // worker to finish a send, so the loop keeps polling until they are.
  int acks_in_flight_ = 0;
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_KV_LANDING_H_
