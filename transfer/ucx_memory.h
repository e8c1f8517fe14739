// Registered memory and remote keys.
//
//   ASSIGN_OR_RETURN(auto region, UcxMemoryRegion::Register(*ctx, buf.data(), buf.size()));
//   // or let UCX allocate it (shared memory on the shm profile, see Allocate):
//   ASSIGN_OR_RETURN(auto region, UcxMemoryRegion::Allocate(*ctx, 64 << 20));
//   ASSIGN_OR_RETURN(std::string rkey, region->PackRkey());   // travels to the peer
//   ...on the peer, progress thread:
//   ASSIGN_OR_RETURN(auto remote, UcxRemoteKey::Unpack(ep->get(), rkey));
//   ucp_put_nbx(ep->get(), src, len, remote_addr, remote->get(), &param);
//
// UcxMemoryRegion is thread-safe (context-level, mt_workers_shared) and must
// outlive every transfer into it. UcxRemoteKey belongs to one endpoint: use
// and destroy it on the progress thread, before the endpoint closes.
#ifndef MMSERVE_TRANSFER_UCX_MEMORY_H_
#define MMSERVE_TRANSFER_UCX_MEMORY_H_

#include <ucp/api/ucp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "transfer/ucx_context.h"

namespace mmserve::transfer {

class UcxMemoryRegion {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<UcxMemoryRegion>> Register(
      UcxContext& context, void* address, size_t length);
  // Allocates `length` bytes through UCX (UCX_ALLOC_PRIO: a SysV or POSIX
  // shared-memory segment when the context has those transports, else mmap)
  // and registers them. A peer on the same host maps a shared segment from the
  // rkey, so its puts become one memcpy straight into this memory; into
  // registered private memory UCX 1.13 emulates them with active messages
  // (copied twice, and only while this side progresses). The memory is
  // released with the region; its initial contents are unspecified.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<UcxMemoryRegion>> Allocate(
      UcxContext& context, size_t length);
  ~UcxMemoryRegion();
  UcxMemoryRegion(const UcxMemoryRegion&) = delete;
  UcxMemoryRegion& operator=(const UcxMemoryRegion&) = delete;

  [[nodiscard]] absl::StatusOr<std::string> PackRkey() const;
  void* address() const { return address_; }
  size_t length() const { return length_; }
  ucp_mem_h get() const { return memh_; }

 private:
  UcxMemoryRegion(UcxContext& context, void* address, size_t length, ucp_mem_h memh)
      : context_(context), address_(address), length_(length), memh_(memh) {}
  UcxContext& context_;
  void* address_;
  size_t length_;
  ucp_mem_h memh_;
};

class UcxRemoteKey {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<UcxRemoteKey>> Unpack(
      ucp_ep_h ep, const std::string& packed);
  ~UcxRemoteKey();
  UcxRemoteKey(const UcxRemoteKey&) = delete;
  UcxRemoteKey& operator=(const UcxRemoteKey&) = delete;

  ucp_rkey_h get() const { return rkey_; }

 private:
  explicit UcxRemoteKey(ucp_rkey_h rkey) : rkey_(rkey) {}
  ucp_rkey_h rkey_;
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_UCX_MEMORY_H_
