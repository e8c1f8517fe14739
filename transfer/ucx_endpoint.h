// A UCX endpoint to a peer's worker, created from its packed address.
//
//   ASSIGN_OR_RETURN(auto ep, UcxEndpoint::Create(worker, peer_address,
//                                                 [](absl::Status s) { /* peer lost */ }));
//   ... ucp_put_nbx(ep->get(), ...) ...
//   ep->Close(Deadline::After(absl::Milliseconds(500)));
//
// The error mode follows the context's profile (PEER for tcp, NONE for shm).
// `on_error` runs on the progress thread from inside ucp_worker_progress; it
// must not close the endpoint (post a task that does). Close() flushes until
// the deadline, then force-closes, so it never hangs on a dead peer; the
// destructor force-closes an endpoint that was not closed. Progress thread
// only, never from inside a UCX callback.
#ifndef MMSERVE_TRANSFER_UCX_ENDPOINT_H_
#define MMSERVE_TRANSFER_UCX_ENDPOINT_H_

#include <ucp/api/ucp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "transfer/ucx_worker.h"

namespace mmserve::transfer {

class UcxEndpoint {
 public:
  using ErrorHandler = std::function<void(absl::Status)>;

  [[nodiscard]] static absl::StatusOr<std::unique_ptr<UcxEndpoint>> Create(
      UcxWorker& worker, const std::string& remote_address, ErrorHandler on_error);
  ~UcxEndpoint();
  UcxEndpoint(const UcxEndpoint&) = delete;
  UcxEndpoint& operator=(const UcxEndpoint&) = delete;

  ucp_ep_h get() const { return ep_; }
  // Flushes outstanding operations until `flush_deadline`, then closes with
  // UCP_EP_CLOSE_FLAG_FORCE (pending requests complete with an error).
  void Close(Deadline flush_deadline);
  bool closed() const { return ep_ == nullptr; }

 private:
  UcxEndpoint(UcxWorker& worker, ErrorHandler on_error)
      : worker_(worker), on_error_(std::move(on_error)) {}
  static void OnError(void* arg, ucp_ep_h ep, ucs_status_t status);

  UcxWorker& worker_;
  ErrorHandler on_error_;
  ucp_ep_h ep_ = nullptr;
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_UCX_ENDPOINT_H_
