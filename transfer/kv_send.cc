#include "transfer/kv_send.h"

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

void StartKvMessages(const KvSendPlan& plan, const std::shared_ptr<KvSendState>& state) {
  const size_t n = plan.segments.size();
  state->remaining = static_cast<int>(n) + 1;  // and the landed message
  // Headers stay valid until their sends complete.
  auto headers = std::make_shared<std::vector<KvDataHeader>>(n);
  for (size_t i = 0; i < n; ++i) {
    KvDataHeader& h = (*headers)[i];
    h.sender = plan.sender;
    h.seq = plan.seq;
    h.offset = plan.segments[i].dst;
    h.messages = static_cast<uint32_t>(n);
  }
  for (size_t i = 0; i < n; ++i) {
    const KvSegment& seg = plan.segments[i];
    StartUcxOp(
        [&](const ucp_request_param_t& p) {
          ucp_request_param_t q = p;
          q.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
          q.flags = UCP_AM_SEND_FLAG_REPLY;  // eager or rendezvous as UCX finds fastest
          return ucp_am_send_nbx(plan.ep, kKvAmData, &(*headers)[i], sizeof(KvDataHeader),
                                 plan.base + seg.src, seg.bytes, &q);
        },
        [state, headers](absl::Status st) { state->Complete(st); });
  }
}

}  // namespace mmserve::transfer
