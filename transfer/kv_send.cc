#include "transfer/kv_send.h"

#include <algorithm>

#include "transfer/kv_landing.h"
#include "transfer/ucx_request.h"

namespace mmserve::transfer {

void KvSendState::Complete(const absl::Status& status) {
  if (settled) return;
  if (status.ok() && --remaining > 0) return;
  settled = true;
  result = status;
  done.Notify();
}

size_t KvMessagesInFlight(bool tcp) { return tcp ? 4 : 1; }

void StartKvPuts(const KvSendPlan& plan, const std::shared_ptr<KvSendState>& state) {
  state->remaining = static_cast<int>(plan.segments.size()) + 1;  // and the flush
  const UcxDone note = [state](absl::Status st) { state->Complete(st); };
  for (const KvSegment& seg : plan.segments) {
    StartUcxOp(
        [&](const ucp_request_param_t& p) {
          return ucp_put_nbx(plan.ep, plan.base + seg.src, seg.bytes, plan.target_base + seg.dst,
                             plan.rkey, &p);
        },
        note);
  }
  StartUcxOp([&](const ucp_request_param_t& p) { return ucp_ep_flush_nbx(plan.ep, &p); }, note);
}

namespace {

// The data messages of one hand-off, started at most `credits` at a time.
struct MessageQueue {
  ucp_ep_h ep;
  const uint8_t* base;
  std::vector<KvSegment> segments;
  std::vector<KvDataHeader> headers;  // valid until their sends complete
  size_t next = 0;
  size_t credits = 0;
  bool pumping = false;  // a completion inside Pump only returns its credit
};

// Starts messages while credits last; each completion returns its credit and
// pumps again (a loop, not recursion: eager sends often complete inline).
void Pump(const std::shared_ptr<MessageQueue>& q, const std::shared_ptr<KvSendState>& state) {
  if (q->pumping) return;
  q->pumping = true;
  while (q->credits > 0 && q->next < q->segments.size() && !state->settled) {
    --q->credits;
    const size_t i = q->next++;
    const KvSegment& seg = q->segments[i];
    StartUcxOp(
        [&](const ucp_request_param_t& p) {
          ucp_request_param_t r = p;
          r.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
          r.flags = UCP_AM_SEND_FLAG_REPLY;  // eager or rendezvous as UCX finds fastest
          return ucp_am_send_nbx(q->ep, kKvAmData, &q->headers[i], sizeof(KvDataHeader),
                                 q->base + seg.src, seg.bytes, &r);
        },
        [q, state](absl::Status st) {
          state->Complete(st);
          ++q->credits;
          Pump(q, state);
        });
  }
  q->pumping = false;
}

}  // namespace

void StartKvMessages(const KvSendPlan& plan, const std::shared_ptr<KvSendState>& state) {
  const size_t n = plan.segments.size();
  state->remaining = static_cast<int>(n) + 1;  // and the landed message
  auto q = std::make_shared<MessageQueue>();
  q->ep = plan.ep;
  q->base = plan.base;
  q->segments = plan.segments;
  q->headers.resize(n);
  for (size_t i = 0; i < n; ++i) {
    KvDataHeader& h = q->headers[i];
    h.sender = plan.sender;
    h.seq = plan.seq;
    h.offset = plan.segments[i].dst;
    h.messages = static_cast<uint32_t>(n);
  }
  q->credits = std::max<size_t>(1, plan.in_flight);
  Pump(q, state);
}

}  // namespace mmserve::transfer
