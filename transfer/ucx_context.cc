#include "transfer/ucx_context.h"

#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "transfer/ucx_status.h"

namespace mmserve::transfer {
namespace {

// ucp_config_t, released when the scope ends.
struct ConfigDeleter {
  void operator()(ucp_config_t* config) const { ucp_config_release(config); }
};

}  // namespace

absl::StatusOr<TransportProfile> ParseTransportProfile(absl::string_view name) {
  if (name == "tcp") return TransportProfile::kTcp;
  if (name == "shm") return TransportProfile::kShm;
  return absl::InvalidArgumentError(absl::StrCat("unknown transport profile '", name, "'"));
}

const char* TransportProfileName(TransportProfile profile) {
  return profile == TransportProfile::kTcp ? "tcp" : "shm";
}

const char* TransportProfileTls(TransportProfile profile) {
  return profile == TransportProfile::kTcp ? "tcp,self" : "posix,sysv,cma,self";
}

const std::string& HostIdentity() {
  static const std::string* id = [] {
    std::string boot = ReadFileToString("/proc/sys/kernel/random/boot_id").value_or("");
    boot = std::string(absl::StripAsciiWhitespace(boot));
    char ipc[64] = {};
    const ssize_t n = readlink("/proc/self/ns/ipc", ipc, sizeof(ipc) - 1);
    absl::string_view inode(ipc, n > 0 ? n : 0);
    absl::ConsumePrefix(&inode, "ipc:");
    return new std::string(absl::StrCat("boot:", boot, " ipc:", inode));
  }();
  return *id;
}

absl::Status CheckSameHost(TransportProfile profile, absl::string_view peer_host,
                           absl::string_view peer) {
  if (profile != TransportProfile::kShm || peer_host.empty() || peer_host == HostIdentity()) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("transport profile shm needs ", peer,
                   " on this host and IPC namespace, but it runs on "
                   "another (",
                   peer_host, "; here: ", HostIdentity(),
                   "): across hosts start every process with --profile=tcp"));
}

ucp_err_handling_mode_t TransportProfileErrMode(TransportProfile profile) {
  return profile == TransportProfile::kTcp ? UCP_ERR_HANDLING_MODE_PEER
                                           : UCP_ERR_HANDLING_MODE_NONE;
}

absl::StatusOr<std::unique_ptr<UcxContext>> UcxContext::Create(TransportProfile profile) {
  ucp_config_t* raw_config = nullptr;
  RETURN_IF_ERROR(UCX_CALL(ucp_config_read(nullptr, nullptr, &raw_config)));
  std::unique_ptr<ucp_config_t, ConfigDeleter> config(raw_config);
  RETURN_IF_ERROR(UCX_CALL(ucp_config_modify(config.get(), "TLS", TransportProfileTls(profile))));

  ucp_params_t params = {};
  params.field_mask =
      UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;
  params.name = TransportProfileName(profile);
  ucp_context_h context = nullptr;
  RETURN_IF_ERROR(UCX_CALL(ucp_init(&params, config.get(), &context)));
  return std::unique_ptr<UcxContext>(new UcxContext(context, profile));
}

UcxContext::~UcxContext() { ucp_cleanup(context_); }

}  // namespace mmserve::transfer
