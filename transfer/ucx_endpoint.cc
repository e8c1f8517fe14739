#include "transfer/ucx_endpoint.h"

#include "common/logging.h"
#include "common/status_macros.h"
#include "transfer/ucx_request.h"
#include "transfer/ucx_status.h"

namespace mmserve::transfer {

absl::StatusOr<std::unique_ptr<UcxEndpoint>> UcxEndpoint::Create(UcxWorker& worker,
                                                                 const std::string& remote_address,
                                                                 ErrorHandler on_error) {
  CHECK(worker.InProgressThread());
  std::unique_ptr<UcxEndpoint> endpoint(new UcxEndpoint(worker, std::move(on_error)));
  ucp_ep_params_t params = {};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(remote_address.data());
  params.err_mode = TransportProfileErrMode(worker.context().profile());
  params.err_handler.cb = &UcxEndpoint::OnError;
  params.err_handler.arg = endpoint.get();
  RETURN_IF_ERROR(UCX_CALL(ucp_ep_create(worker.get(), &params, &endpoint->ep_)));
  return endpoint;
}

void UcxEndpoint::OnError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<UcxEndpoint*>(arg);
  if (self->on_error_) self->on_error_(UcxStatus(status, "peer endpoint failed"));
}

void UcxEndpoint::Close(Deadline flush_deadline) {
  if (ep_ == nullptr) return;
  CHECK(worker_.InProgressThread());
  auto flushed = std::make_shared<bool>(false);
  void* flush = StartUcxOp([&](const ucp_request_param_t& p) { return ucp_ep_flush_nbx(ep_, &p); },
                           [flushed](absl::Status) { *flushed = true; });
  while (flush != nullptr && !*flushed && !flush_deadline.Expired()) worker_.Progress();

  auto closed = std::make_shared<bool>(false);
  void* close = StartUcxOp(
      [&](const ucp_request_param_t& p) {
        ucp_request_param_t q = p;
        q.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        q.flags = UCP_EP_CLOSE_FLAG_FORCE;
        return ucp_ep_close_nbx(ep_, &q);
      },
      [closed](absl::Status) { *closed = true; });
  // A forced close completes locally; bound the wait anyway.
  Deadline close_deadline = Deadline::After(absl::Seconds(2));
  while (close != nullptr && !*closed && !close_deadline.Expired()) worker_.Progress();
  if (close != nullptr && !*closed) LOG(WARNING) << "UCX endpoint close did not complete";
  ep_ = nullptr;
}

UcxEndpoint::~UcxEndpoint() { Close(Deadline::After(absl::ZeroDuration())); }

}  // namespace mmserve::transfer
