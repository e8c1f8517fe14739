// Completion of non-blocking UCX operations (the *_nbx calls) as callbacks.
//
//   void* req = StartUcxOp(
//       [&](const ucp_request_param_t& p) { return ucp_put_nbx(ep, buf, len, addr, rkey, &p); },
//       [](absl::Status s) { /* on the progress thread, once */ });
//   if (req != nullptr) outstanding.insert(req);  // to ucp_request_cancel later
//
// `done` runs exactly once: inline when the operation completes (or fails)
// immediately, else from UCX's callback during ucp_worker_progress. The
// returned request is valid until `done` runs; nullptr when it already ran.
// Progress thread only.
#ifndef MMSERVE_TRANSFER_UCX_REQUEST_H_
#define MMSERVE_TRANSFER_UCX_REQUEST_H_

#include <ucp/api/ucp.h>

#include <functional>

#include "absl/status/status.h"

namespace mmserve::transfer {

using UcxDone = std::function<void(absl::Status)>;
// Called with the request fields filled in; returns the *_nbx result.
using UcxStarter = std::function<ucs_status_ptr_t(const ucp_request_param_t&)>;
// Tag receives also report the received length.
using UcxRecvDone = std::function<void(absl::Status, size_t length)>;

// Send-type operations (put, get, flush, tag send, am send, ep close).
void* StartUcxOp(const UcxStarter& start, UcxDone done, ucp_datatype_t datatype = 0);
// Tag receives.
void* StartUcxTagRecv(const UcxStarter& start, UcxRecvDone done);
// Active-message data receives (ucp_am_recv_data_nbx of a rendezvous).
void* StartUcxAmRecv(const UcxStarter& start, UcxRecvDone done);

// Sets the handler of active-message `id` on `worker` (UCX 1.13 crashes on a
// message whose id has none: register before peers can send it).
[[nodiscard]] absl::Status SetUcxAmHandler(ucp_worker_h worker, uint16_t id,
                                           ucp_am_recv_callback_t cb, void* arg);

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_UCX_REQUEST_H_
