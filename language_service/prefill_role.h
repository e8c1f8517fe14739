// Role prefill (role.h): runs prompts to their first token and hands
// the prompt's KV to the decode instance each request names: AllocateKv on
// it, one set of UCX puts per decode rank (its slice of the KV heads,
// transfer/kv_handoff), CommitKv with each rank's CRC32C. Loop thread only.
#ifndef MMSERVE_LANGUAGE_SERVICE_PREFILL_ROLE_H_
#define MMSERVE_LANGUAGE_SERVICE_PREFILL_ROLE_H_

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "common/clock.h"
#include "language_service/role.h"
#include "proto/language.grpc.pb.h"
#include "transfer/kv_handoff.h"
#include "transfer/wire_bytes.h"

namespace mmserve::language {

class PrefillRole final : public Role {
 public:
  // `bytes` counts the KV handed off (sent).
  PrefillRole(const RoleOptions& options, std::string instance_id, transfer::WireBytes bytes)
      : options_(options), instance_id_(std::move(instance_id)), bytes_(bytes) {}

  LanguageRole kind() const override { return LanguageRole::kPrefill; }
  std::unique_ptr<worker::KvConnector> MakeConnector() const override {
    return std::make_unique<worker::PrefillKvConnector>();
  }
  absl::Status Attach(worker::LlmEngine& engine) override;
  absl::Status CheckPrefill(const v1::PrefillRequest& request) const override;
  // Token ids now: they travel in AllocateKv and KvCommit.
  absl::Status PreparePrefill(const v1::PrefillRequest& request, const model::Tokenizer& tokenizer,
                              worker::EngineRequest& engine_request) const override;
  absl::StatusOr<HandOffResult> HandOff(const HandOffRequest& request) override;

 private:
  v1::Language::Stub& DecodeStub(const std::string& address);
  // The writes to every decode rank of `alloc`; their CRC32Cs into
  // `commit`, how each moved into result.paths.
  absl::Status PutToRanks(const HandOffRequest& request, const v1::KvAllocation& alloc,
                          Deadline deadline, v1::KvCommit& commit, HandOffResult& result);

  const RoleOptions options_;
  const std::string instance_id_;
  const transfer::WireBytes bytes_;
  worker::LlmEngine* engine_ = nullptr;
  std::unique_ptr<transfer::UcxContext> kv_context_;
  std::unique_ptr<transfer::KvHandoffSender> kv_sender_;
  std::map<std::string, std::unique_ptr<v1::Language::Stub>> decode_stubs_;
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_PREFILL_ROLE_H_
