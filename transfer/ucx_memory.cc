#include "transfer/ucx_memory.h"

#include "common/status_macros.h"
#include "transfer/ucx_status.h"

namespace mmserve::transfer {

absl::StatusOr<std::unique_ptr<UcxMemoryRegion>> UcxMemoryRegion::Register(UcxContext& context,
                                                                           void* address,
                                                                           size_t length) {
  ucp_mem_map_params_t params = {};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = address;
  params.length = length;
  ucp_mem_h memh = nullptr;
  RETURN_IF_ERROR(UCX_CALL(ucp_mem_map(context.get(), &params, &memh)));
  return std::unique_ptr<UcxMemoryRegion>(new UcxMemoryRegion(context, address, length, memh));
}

absl::StatusOr<std::unique_ptr<UcxMemoryRegion>> UcxMemoryRegion::Allocate(UcxContext& context,
                                                                           size_t length) {
  ucp_mem_map_params_t params = {};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.address = nullptr;
  params.length = length;
  params.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h memh = nullptr;
  RETURN_IF_ERROR(UCX_CALL(ucp_mem_map(context.get(), &params, &memh)));
  ucp_mem_attr_t attr = {};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  if (absl::Status s = UCX_CALL(ucp_mem_query(memh, &attr)); !s.ok()) {
    ucp_mem_unmap(context.get(), memh);
    return s;
  }
  if (attr.length < length) {
    ucp_mem_unmap(context.get(), memh);
    return absl::InternalError("ucp_mem_map allocated less than asked");
  }
  return std::unique_ptr<UcxMemoryRegion>(new UcxMemoryRegion(context, attr.address, length, memh));
}

UcxMemoryRegion::~UcxMemoryRegion() { ucp_mem_unmap(context_.get(), memh_); }

absl::StatusOr<std::string> UcxMemoryRegion::PackRkey() const {
  void* buffer = nullptr;
  size_t size = 0;
  RETURN_IF_ERROR(UCX_CALL(ucp_rkey_pack(context_.get(), memh_, &buffer, &size)));
  std::string packed(static_cast<const char*>(buffer), size);
  ucp_rkey_buffer_release(buffer);
  return packed;
}

absl::StatusOr<std::unique_ptr<UcxRemoteKey>> UcxRemoteKey::Unpack(ucp_ep_h ep,
                                                                   const std::string& packed) {
  ucp_rkey_h rkey = nullptr;
  RETURN_IF_ERROR(UCX_CALL(ucp_ep_rkey_unpack(ep, packed.data(), &rkey)));
  return std::unique_ptr<UcxRemoteKey>(new UcxRemoteKey(rkey));
}

UcxRemoteKey::~UcxRemoteKey() { ucp_rkey_destroy(rkey_); }

}  // namespace mmserve::transfer
