// The Language gRPC service (proto/language.proto) over a LanguageCore, role
// `both`: Prefill streams the whole generation. Streams use gRPC's callback
// API, so an open stream holds no thread; a client cancel or deadline aborts
// the request in the core, which frees its KV and embedding blocks.
//
// Decode, AllocateKv and CommitKv are role decode's own calls (DecodeCalls),
// ElasticPrefill and ElasticMoveMaster role elastic's (ElasticCalls); a role that
// has none of them answers UNIMPLEMENTED. Prefill in role prefill ends its
// stream once the KV is handed off (kv_handed_off). Every handler enters
// through one function per kind (ServeInternal for unary calls, one
// OpenStream for streams), which refuses a call without the cluster token
// (common/internal_plane.h). Thread-safe.
#ifndef MMSERVE_LANGUAGE_SERVICE_LANGUAGE_SERVICE_H_
#define MMSERVE_LANGUAGE_SERVICE_LANGUAGE_SERVICE_H_

#include <atomic>
#include <string>

#include "common/metrics.h"
#include "language_service/language_core.h"
#include "proto/language.grpc.pb.h"

namespace mmserve::language {

class LanguageService final : public v1::Language::CallbackService {
 public:
  LanguageService(LanguageCore& core, transfer::TransferEngine& transfer,
                  metrics::Registry& metrics);

  grpc::ServerWriteReactor<v1::TokenBatch>* Prefill(grpc::CallbackServerContext* ctx,
                                                    const v1::PrefillRequest* request) override;
  grpc::ServerWriteReactor<v1::TokenBatch>* Decode(grpc::CallbackServerContext* ctx,
                                                   const v1::DecodeRequest* request) override;
  // Role elastic: one member's part of a group prefill (ElasticCalls::ElasticPrefill).
  grpc::ServerWriteReactor<v1::TokenBatch>* ElasticPrefill(
      grpc::CallbackServerContext* ctx, const v1::ElasticPrefillRequest* request) override;
  // Role elastic: the next master of a group takes over (ElasticCalls::ElasticMoveMaster).
  grpc::ServerUnaryReactor* ElasticMoveMaster(grpc::CallbackServerContext* ctx,
                                              const v1::ElasticMoveRequest* request,
                                              v1::ElasticMoveAck* response) override;
  grpc::ServerUnaryReactor* AllocateKv(grpc::CallbackServerContext* ctx,
                                       const v1::KvAllocateRequest* request,
                                       v1::KvAllocation* response) override;
  grpc::ServerUnaryReactor* CommitKv(grpc::CallbackServerContext* ctx, const v1::KvCommit* request,
                                     v1::KvCommitAck* response) override;
  grpc::ServerUnaryReactor* RetryImages(grpc::CallbackServerContext* ctx,
                                        const v1::ImageRetry* request,
                                        v1::ImageRetryAck* response) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx, const v1::AbortRequest* request,
                                  v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* Connect(grpc::CallbackServerContext* ctx,
                                    const v1::ConnectRequest* request,
                                    v1::ConnectResponse* response) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* ctx,
                                    const v1::LoadRequest* request,
                                    v1::LoadReport* response) override;

  // While draining, Prefill refuses new requests with UNAVAILABLE.
  void SetAccepting(bool accepting) { accepting_ = accepting; }

 private:
  LanguageCore& core_;
  transfer::TransferEngine& transfer_;
  metrics::Registry& metrics_;
  std::atomic<bool> accepting_{true};
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_LANGUAGE_SERVICE_H_
