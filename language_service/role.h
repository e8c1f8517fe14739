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
//   RETURN_IF_ERROR(role->AdjustEngineOptions(engine_options));  // before the engine exists
//   engine = LlmEngine::Create(engine_options, role->MakeConnector());
//   RETURN_IF_ERROR(role->Attach(host));           // after (host: the core)
//
// A role serves its own calls (DecodeCalls, ElasticCalls: the service asks
// the role for them and answers Unimplemented where it has none) and hooks
// into the core's request path (Admit, TakeEvent, Step); the core never
// asks which role it runs. The calls are thread-safe (they reach the loop
// through RoleHost); every other method but MakeRole and
// AdjustEngineOptions runs on the core's loop thread (the engine's), or
// before it starts.
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
#include "language_service/elastic_groups.h"
#include "language_service/request_table.h"
#include "language_service/role_host.h"
#include "proto/language.pb.h"
#include "proto/registry.pb.h"
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
  // Role decode: how long a reservation waits for its CommitKv; role
  // prefill: how long a layer-wise hand-off waits for the forward.
  absl::Duration kv_commit_timeout = absl::Seconds(60);
  // Role prefill: AllocateKv, the puts and CommitKv together.
  absl::Duration kv_handoff_timeout = absl::Seconds(10);
  // Role prefill: the layer-wise hand-off. Layers per group, each written
  // to the decode ranks as soon as the forward that ends the prompt has
  // computed it, while the next layers compute; 0: the prompt's KV goes
  // whole after its forward.
  int handoff_layer_group = 4;
  // Role prefill: prompts shorter than this (tokens) go whole after their
  // forward, as with handoff_layer_group 0.
  int handoff_layerwise_min_tokens = 8192;
  // TEST ONLY. Role prefill: how long each hand-off waits between AllocateKv
  // and the puts (a layer-wise one: after its first layer group), on its
  // hand-off thread, inside kv_handoff_timeout, so that fault tests kill a
  // process mid-hand-off deterministically. Zero in production.
  absl::Duration test_kv_handoff_delay = absl::ZeroDuration();
};

// Role decode's own calls (decode_role.h), from gRPC threads.
class DecodeCalls {
 public:
  virtual ~DecodeCalls() = default;
  // Opens a request whose KV a prefill instance will hand over; `sink` gets
  // an empty batch once the request is held (AllocateKv may come from then
  // on), then its tokens from the second one on. Checks as Submit does.
  [[nodiscard]] virtual absl::Status Decode(const v1::DecodeRequest& request, RequestSink sink) = 0;
  // Reserves the blocks of a registered request. FailedPrecondition when it
  // is not registered or already reserved, ResourceExhausted when there is
  // no room now, InvalidArgument for image spans that disagree with the
  // token ids (the request stays registered) or an M-RoPE delta that
  // disagrees with them (the request ends).
  [[nodiscard]] virtual absl::StatusOr<v1::KvAllocation> AllocateKv(
      const v1::KvAllocateRequest& request) = 0;
  // The reserved blocks hold the KV; DataLoss (and the request ends) when
  // their CRC32C differs from the commit's, InvalidArgument (and the request
  // ends) when its M-RoPE delta differs from the allocation's, or (and the
  // reservation stays) for a commit of the wrong shape.
  [[nodiscard]] virtual absl::Status CommitKv(const v1::KvCommit& commit) = 0;
};

// Role elastic's own calls (elastic_role.h), from gRPC threads.
class ElasticCalls {
 public:
  virtual ~ElasticCalls() = default;
  // Member `request.member` of a group prefill (elastic_groups.h). Checks as
  // Submit does, waits for the request's images like it, then runs the
  // member's part on the loop thread. The stream: the sampler's carries the
  // first token (with finish_reason when that token ends the request); the
  // master's the tokens after it, to the finish; every other member's ends
  // OK, empty, once its span is kept (or freed, when it keeps none).
  [[nodiscard]] virtual absl::Status ElasticPrefill(const v1::ElasticPrefillRequest& request,
                                                    RequestSink sink) = 0;
  // The request's next master (this instance, waiting in its ElasticPrefill)
  // takes over from the previous one's state (its stream's
  // TokenBatch.elastic_moved) and streams the tokens after it. NotFound when no
  // such request waits here to master; InvalidArgument when the state does
  // not continue its decode range (the request ends).
  [[nodiscard]] virtual absl::Status ElasticMoveMaster(const v1::ElasticMoveRequest& request) = 0;
  // Keeps a span of `tokens` of request `id`'s KV here for a group prefill
  // (LlmEngine::HoldSpan): its block ids. Abort(id) frees it. AlreadyExists
  // and ResourceExhausted as the engine's, Unavailable when shutting down.
  [[nodiscard]] virtual absl::StatusOr<std::vector<int32_t>> HoldSpan(const std::string& id,
                                                                      int tokens) = 0;
  // InstanceInfo.elastic_endpoint.
  virtual std::string endpoint() const = 0;
  // Spans held here for other masters' decodes.
  virtual size_t num_held_spans() const = 0;
};

class Role {
 public:
  virtual ~Role() = default;

  // Before the engine is created: what the role needs of it, or why the
  // role cannot run on such an engine (Unimplemented).
  [[nodiscard]] virtual absl::Status AdjustEngineOptions(worker::EngineOptions& options) const {
    return absl::OkStatus();
  }
  // The engine's side of the role (worker/kv_connector.h); null for role
  // both, which needs none.
  virtual std::unique_ptr<worker::KvConnector> MakeConnector() const { return nullptr; }
  // After: the role's own resources over the engine's KV cache. `host`
  // (the core) outlives the role.
  [[nodiscard]] virtual absl::Status Attach(RoleHost& host) { return absl::OkStatus(); }

  // Prefill calls: whether this role takes `request`, and what it changes
  // in the engine request before it is queued.
  [[nodiscard]] virtual absl::Status CheckPrefill(const v1::PrefillRequest& request) const = 0;
  [[nodiscard]] virtual absl::Status PreparePrefill(const v1::PrefillRequest& request,
                                                    const model::Tokenizer& tokenizer,
                                                    worker::EngineRequest& engine_request) const {
    return absl::OkStatus();
  }

  // The role's own calls; null where the role serves none of them (the
  // service answers Unimplemented).
  virtual DecodeCalls* decode_calls() { return nullptr; }
  virtual ElasticCalls* elastic_calls() { return nullptr; }
  // What the registration says of the role beyond its kind.
  virtual void Describe(v1::InstanceInfo& info) const {}

  // Loop thread only, from here on: the hooks of the core's request path.
  // A request whose images have all arrived: true when the role runs it
  // itself, beside the engine's batch (else the core adds it to the engine).
  virtual bool Admit(LiveRequest& r) { return false; }
  // Whether the role runs `r` itself (Admit): it ends at once on Abort, and
  // Release frees what it holds when it ends.
  virtual bool Owns(const LiveRequest& r) const { return false; }
  virtual void Release(const std::string& id, const absl::Status& status) {}
  // Abort of an id with no request here (a span the role holds).
  virtual void AbortUnknown(const std::string& id) {}
  // An engine event of `r` and its batch: true when the role took both (the
  // prompt's end on role prefill), else the core streams the batch.
  virtual bool TakeEvent(LiveRequest& r, const worker::StreamEvent& e, v1::TokenBatch& batch) {
    return false;
  }
  // From the loop's step hook: the role's own work; whether more is ready
  // at once.
  virtual bool Step() { return false; }
  // Requests the role runs beside the engine's batch (the load report).
  virtual size_t num_running() const { return 0; }
};

// `instance_id` names the role's UCX worker; roles prefill and decode count
// the KV they hand off in `metrics` (kv_bytes_moved.h, kind handoff), which
// must outlive the role; role elastic's groups take `elastic` (its name and
// profile are set from instance_id and options.kv_profile).
[[nodiscard]] absl::StatusOr<std::unique_ptr<Role>> MakeRole(
    const RoleOptions& options, const std::string& instance_id, metrics::Registry& metrics,
    const ElasticGroupsOptions& elastic = {});

// The images of a handed-off prompt, for LlmEngine::AddRequest (which
// checks them against the token ids): InvalidArgument for spans outside the
// prompt or grids out of range.
[[nodiscard]] absl::StatusOr<std::vector<worker::HandoffMedia>> HandoffImagesFromProto(
    const v1::KvAllocateRequest& request);

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_ROLE_H_
