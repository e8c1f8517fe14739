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

void* StartUcxTagRecv(const UcxStarter& start, UcxRecvDone done) {
  auto owned = std::make_unique<UcxRecvDone>(std::move(done));
  ucp_request_param_t param = {};
  ucp_tag_recv_info_t info = {};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO;
  param.cb.recv = &RecvCallback;
  param.user_data = owned.get();
  param.recv_info.tag_info = &info;
  ucs_status_ptr_t ptr = start(param);
  if (UCS_PTR_IS_PTR(ptr)) {
    owned.release();  // RecvCallback owns it now
    return ptr;
  }
  ucs_status_t status = UCS_PTR_STATUS(ptr);
  (*owned)(UcxStatus(status, "ucx tag receive"), status == UCS_OK ? info.length : 0);
  return nullptr;
}

void* StartUcxAmRecv(const UcxStarter& start, UcxRecvDone done) {
  auto owned = std::make_unique<UcxRecvDone>(std::move(done));
  ucp_request_param_t param = {};
  size_t length = 0;
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO;
  param.cb.recv_am = &AmRecvCallback;
  param.user_data = owned.get();
  param.recv_info.length = &length;
  ucs_status_ptr_t ptr = start(param);
  if (UCS_PTR_IS_PTR(ptr)) {
    owned.release();  // AmRecvCallback owns it now
    return ptr;
  }
  ucs_status_t status = UCS_PTR_STATUS(ptr);
  (*owned)(UcxStatus(status, "ucx active message receive"), status == UCS_OK ? length : 0);
  return nullptr;
}

}  // namespace mmserve::transfer
