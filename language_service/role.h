// What a language instance's role changes about a request (the roles
// behind one interface, chosen once at start, so that LanguageCore has no
// role branches):
//
//   both     colocated prefill and decode: every call but Prefill refused;
//   elastic  role both for requests that come alone, and a member of
//            elastic sequence-parallelism groups (elastic_role.h);
//   prefill  runs Prefill requests to their first token, then hands the
//            prompt's KV to the decode instance the request names
//            (AllocateKv, UCX puts per decode rank, CommitKv);
//   decode   holds Decode calls, reserves KV blocks for a prefill instance
//            to write (AllocateKv), checks them (CommitKv) and decodes on.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Role> role, MakeRole(options, instance_id, registry));
//   role->AdjustEngineOptions(engine_options);    // before the engine exists
//   engine = LlmEngine::Create(engine_options, role->MakeConnector());
//   RETURN_IF_ERROR(role->Attach(*engine));        // after
//
// Every method but MakeRole and AdjustEngineOptions runs on the
// language core's loop thread (the engine's), or before it starts.
#ifndef MMSERVE_LANGUAGE_SERVICE_ROLE_H_
#define MMSERVE_LANGUAGE_SERVICE_ROLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "proto/language.pb.h"
#include "transfer/kv_handoff.h"
#include "transfer/transfer_engine.h"
#include "worker/engine.h"
#include "worker/kv_connector.h"

namespace mmserve::language {

namespace v1 = ::mmserve::internal::v1;

enum class LanguageRole { kBoth, kPrefill, kDecode, kElastic };

// The options of the role (a part of LanguageCoreOptions).
struct RoleOptions {
  LanguageRole kind = LanguageRole::kBoth;
  // Roles prefill and decode: the UCX profile of the KV hand-off.
  transfer::TransportProfile kv_profile = transfer::TransportProfile::kShm;
  // Role decode: how long a reservation waits for its CommitKv.
  absl::Duration kv_commit_timeout = absl::Seconds(10);
  // Role prefill: AllocateKv, the puts and CommitKv together.
  absl::Duration kv_handoff_timeout = absl::Seconds(10);
  // TEST ONLY. Role prefill: how long each hand-off waits between AllocateKv
  // and the puts (on the loop thread, inside kv_handoff_timeout), so that
  // fault tests kill a process mid-hand-off deterministically. Zero in
  // production.
  absl::Duration test_kv_handoff_delay = absl::ZeroDuration();
};

// What a prefill instance hands over: the request's prompt as the engine
// expanded it, its KV blocks, and the first token it sampled.
struct HandOffRequest {
  std::string request_id;
  v1::DecodeTarget decode;  // where the request decodes
  int max_tokens = 0;
  uint64_t seed = 0;
  int32_t first_token = -1;
  const std::vector<int32_t>* kv_blocks = nullptr;
  const worker::HandoffPrompt* prompt = nullptr;
};

// What a hand-off waited for and how its bytes moved (role prefill).
struct HandOffResult {
  // Control round trips, one after another: AllocateKv, each decode rank's
  // landed reply or flush (none for a rank whose cache is mapped here: the
  // copy is done when it returns), CommitKv.
  int round_trips = 0;
  std::vector<transfer::KvHandoffPath> paths;  // one per decode rank
};

class Role {
 public:
  virtual ~Role() = default;

  virtual LanguageRole kind() const = 0;
  // Before the engine is created: what the role needs of it.
  virtual void AdjustEngineOptions(worker::EngineOptions& options) const {}
  // The engine's side of the role (worker/kv_connector.h); null for role
  // both, which needs none.
  virtual std::unique_ptr<worker::KvConnector> MakeConnector() const { return nullptr; }
  // After: the role's own resources over the engine's KV cache.
  [[nodiscard]] virtual absl::Status Attach(worker::LlmEngine& engine) { return absl::OkStatus(); }

  // Prefill calls: whether this role takes `request`, and what it changes
  // in the engine request before it is queued.
  [[nodiscard]] virtual absl::Status CheckPrefill(const v1::PrefillRequest& request) const = 0;
  [[nodiscard]] virtual absl::Status PreparePrefill(const v1::PrefillRequest& request,
                                                    const model::Tokenizer& tokenizer,
                                                    worker::EngineRequest& engine_request) const {
    return absl::OkStatus();
  }
  // Decode, AllocateKv and CommitKv calls: Unimplemented but on role decode.
  [[nodiscard]] virtual absl::Status CheckDecodeCall() const {
    return absl::UnimplementedError("only role decode takes Decode calls and KV hand-offs");
  }

  // Role prefill: hands a request's KV to its decode instance (blocks the
  // loop for its duration, bounded by kv_handoff_timeout):
  // mmserve_language_kv_handoff_round_trips and _total{path}.
  [[nodiscard]] virtual absl::StatusOr<HandOffResult> HandOff(const HandOffRequest& request) {
    return absl::InternalError("this role hands off no KV");
  }

  // Role decode: the answer to AllocateKv for blocks reserved in the engine,
  // after the engine's earlier reads of them have finished on every rank.
  [[nodiscard]] virtual absl::StatusOr<v1::KvAllocation> Allocation(
      const v1::KvAllocateRequest& request, const worker::RemoteKvBlocks& blocks) {
    return absl::InternalError("this role reserves no KV");
  }
  // Role decode: the committed KV is what the prefill instance wrote (every
  // rank's CRC32C of its own heads): DataLoss when not. InvalidArgument for
  // a commit of the wrong shape (not one CRC32C per rank), which leaves the
  // reservation in place.
  [[nodiscard]] virtual absl::Status CheckCommit(const v1::KvCommit& commit,
                                                 const std::vector<int32_t>& blocks) {
    return absl::InternalError("this role reserves no KV");
  }
};

// `instance_id` names the role's UCX worker; roles prefill and decode count
// the KV they hand off in `metrics` (kv_bytes_moved.h, kind handoff), which
// must outlive the role.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Role>> MakeRole(const RoleOptions& options,
                                                             const std::string& instance_id,
                                                             metrics::Registry& metrics);

// The images of a handed-off prompt, for LlmEngine::AddRequest (which
// checks them against the token ids): InvalidArgument for spans outside the
// prompt or grids out of range.
[[nodiscard]] absl::StatusOr<std::vector<worker::HandoffImage>> HandoffImagesFromProto(
    const v1::KvAllocateRequest& request);

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_ROLE_H_
