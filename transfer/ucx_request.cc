#include "transfer/ucx_request.h"

#include <memory>

#include "transfer/ucx_status.h"

namespace mmserve::transfer {
namespace {

void SendCallback(void* request, ucs_status_t status, void* user_data) {
  std::unique_ptr<UcxDone> done(static_cast<UcxDone*>(user_data));
  ucp_request_free(request);
  (*done)(UcxStatus(status, "ucx operation"));
}

void RecvCallback(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                  void* user_data) {
  std::unique_ptr<UcxRecvDone> done(static_cast<UcxRecvDone*>(user_data));
  size_t length = status == UCS_OK ? info->length : 0;
  ucp_request_free(request);
  (*done)(UcxStatus(status, "ucx tag receive"), length);
}

void AmRecvCallback(void* request, ucs_status_t status, size_t length, void* user_data) {
  std::unique_ptr<UcxRecvDone> done(static_cast<UcxRecvDone*>(user_data));
  ucp_request_free(request);
  (*done)(UcxStatus(status, "ucx active message receive"), status == UCS_OK ? length : 0);
}

}  // namespace

void* StartUcxOp(const UcxStarter& start, UcxDone done, ucp_datatype_t datatype) {
  auto owned = std::make_unique<UcxDone>(std::move(done));
  ucp_request_param_t param = {};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &SendCallback;
  param.user_data = owned.get();
  if (datatype != 0) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = datatype;
  }
  ucs_status_ptr_t ptr = start(param);
  if (UCS_PTR_IS_PTR(ptr)) {
    owned.release();  // SendCallback owns it now
    return ptr;
  }
  (*owned)(UcxStatus(UCS_PTR_STATUS(ptr), "ucx operation"));
  return nullptr;
}

namespace {

// Tag (am = false) and active-message data receives differ only in their
// callback and where UCX reports the length.
void* StartRecv(const UcxStarter& start, UcxRecvDone done, bool am) {
  const char* what = am ? "ucx active message receive" : "ucx tag receive";
  auto owned = std::make_unique<UcxRecvDone>(std::move(done));
  ucp_request_param_t param = {};
  ucp_tag_recv_info_t info = {};
  size_t length = 0;
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO;
  if (am) {
    param.cb.recv_am = &AmRecvCallback;
    param.recv_info.length = &length;
  } else {
    param.cb.recv = &RecvCallback;
    param.recv_info.tag_info = &info;
  }
  param.user_data = owned.get();
  ucs_status_ptr_t ptr = start(param);
  if (UCS_PTR_IS_PTR(ptr)) {
    owned.release();  // the callback owns it now
    return ptr;
  }
  ucs_status_t status = UCS_PTR_STATUS(ptr);
  (*owned)(UcxStatus(status, what), status != UCS_OK ? 0 : am ? length : info.length);
  return nullptr;
}

}  // namespace

void* StartUcxTagRecv(const UcxStarter& start, UcxRecvDone done) {
  return StartRecv(start, std::move(done), /*am=*/false);
}

void* StartUcxAmRecv(const UcxStarter& start, UcxRecvDone done) {
  return StartRecv(start, std::move(done), /*am=*/true);
}

absl::Status SetUcxAmHandler(ucp_worker_h worker, uint16_t id, ucp_am_recv_callback_t cb,
                             void* arg) {
  ucp_am_handler_param_t param = {};
  param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                     UCP_AM_HANDLER_PARAM_FIELD_ARG;
  param.id = id;
  param.cb = cb;
  param.arg = arg;
  return UCX_CALL(ucp_worker_set_am_recv_handler(worker, &param));
}

}  // namespace mmserve::transfer
