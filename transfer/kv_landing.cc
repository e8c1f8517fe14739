#include "transfer/kv_landing.h"

#include <cstring>
#include <memory>

#include "common/logging.h"
#include "transfer/ucx_request.h"
#include "transfer/ucx_status.h"

namespace mmserve::transfer {

absl::Status KvLandingPad::Register() {
  return SetUcxAmHandler(worker_.get(), kKvAmData, &KvLandingPad::OnData, this);
}

void KvLandingPad::Close() {
  closed_ = true;
  landings_.clear();
}

void KvLandingPad::Expire(absl::Duration idle) {
  if (landings_.empty()) return;
  const absl::Time now = absl::Now();
  for (auto it = landings_.begin(); it != landings_.end();) {
    if (now - it->second.last > idle) {
      LOG(WARNING) << "KV hand-off: dropped a partly landed hand-off after " << idle
                   << " without a message from its sender";
      it = landings_.erase(it);
    } else {
      ++it;
    }
  }
}

ucs_status_t KvLandingPad::OnData(void* arg, const void* header, size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* param) {
  auto* pad = static_cast<KvLandingPad*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (header_length != sizeof(KvDataHeader) || pad->closed_) {
    return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;  // fails the sender's operation
  }
  KvDataHeader h;
  std::memcpy(&h, header, sizeof(h));
  return pad->Land(h, data, length, *param);
}

ucs_status_t KvLandingPad::Land(const KvDataHeader& h, void* data, size_t length,
                                const ucp_am_recv_param_t& param) {
  const Key key{h.sender, h.seq};
  Landing& l = landings_[key];
  l.expected = h.messages;
  l.last = absl::Now();
  if (param.recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) l.reply = param.reply_ep;
  const bool rndv = (param.recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (h.messages == 0 || h.offset > length_ || length > length_ - h.offset) {
    LOG(WARNING) << "KV hand-off: refused " << length << " bytes outside the cache";
    Landed(key, false);
    return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
  }
  uint8_t* into = base_ + h.offset;
  if (!rndv) {
    std::memcpy(into, data, length);
    Landed(key, true);
    return UCS_OK;
  }
  StartUcxAmRecv(
      [&](const ucp_request_param_t& p) {
        return ucp_am_recv_data_nbx(worker_.get(), data, into, length, &p);
      },
      [this, key, length](absl::Status st, size_t got) { Landed(key, st.ok() && got == length); });
  return UCS_INPROGRESS;
}

void KvLandingPad::Landed(const Key& key, bool ok) {
  auto it = landings_.find(key);
  if (it == landings_.end()) return;  // expired, or the pad closed
  Landing& l = it->second;
  l.ok = l.ok && ok;
  ++l.landed;
  l.last = absl::Now();
  if (l.landed < l.expected) return;
  auto ack = std::make_shared<KvLandedHeader>();
  ack->seq = key.second;
  ack->messages = l.landed;
  ack->ok = l.ok ? 1 : 0;
  ucp_ep_h reply = l.reply;
  landings_.erase(it);
  if (reply == nullptr) {
    LOG(WARNING) << "KV hand-off: landed, but its sender asked for no reply";
    return;
  }
  // From inside UCX's callback, as UCX's own reply pattern does: the reply
  // endpoint is valid now, and the sender is waiting.
  ++acks_in_flight_;
  StartUcxOp(
      [&](const ucp_request_param_t& p) {
        ucp_request_param_t q = p;
        q.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        q.flags = UCP_AM_SEND_FLAG_EAGER;
        return ucp_am_send_nbx(reply, kKvAmLanded, ack.get(), sizeof(*ack), nullptr, 0, &q);
      },
      [this, ack](absl::Status s) {
        --acks_in_flight_;
        if (!s.ok()) LOG(WARNING) << "KV hand-off: landed message not sent: " << s;
      });
}

}  // namespace mmserve::transfer
