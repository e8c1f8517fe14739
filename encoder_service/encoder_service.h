// The Encoder gRPC service (proto/encoder.proto) over an EncoderCore and the
// process's transfer engine, on gRPC's callback API: no call holds a thread
// while its images wait for the decoder or the tower.
//
// Transfers themselves are driven by the language side's control messages,
// which travel as UCX active messages straight to the transfer engine
// (transfer/transfer_engine.h); StartTransfer, ResumeTransfer and
// FinishTransfer therefore answer UNIMPLEMENTED. CancelTransfer drops the
// request's images still queued here. Thread-safe.
#ifndef MMSERVE_ENCODER_SERVICE_ENCODER_SERVICE_H_
#define MMSERVE_ENCODER_SERVICE_ENCODER_SERVICE_H_

#include <atomic>
#include <string>

#include "common/metrics.h"
#include "encoder_service/encoder_core.h"
#include "proto/encoder.grpc.pb.h"
#include "transfer/transfer_engine.h"

namespace mmserve::encoder {

class EncoderService final : public v1::Encoder::CallbackService {
 public:
  // Everything borrowed must outlive the service.
  EncoderService(std::string instance_id, EncoderCore& core, transfer::TransferEngine& engine,
                 metrics::Registry& metrics);

  grpc::ServerUnaryReactor* Encode(grpc::CallbackServerContext* ctx,
                                   const v1::EncodeRequest* request,
                                   v1::EncodeResponse* response) override;
  grpc::ServerUnaryReactor* StartTransfer(grpc::CallbackServerContext* ctx,
                                          const v1::EmbeddingTransferInit* request,
                                          v1::TransferAck* response) override;
  grpc::ServerUnaryReactor* ResumeTransfer(grpc::CallbackServerContext* ctx,
                                           const v1::EmbeddingTransferResume* request,
                                           v1::TransferAck* response) override;
  grpc::ServerUnaryReactor* CancelTransfer(grpc::CallbackServerContext* ctx,
                                           const v1::EmbeddingTransferCancel* request,
                                           v1::TransferAck* response) override;
  grpc::ServerUnaryReactor* FinishTransfer(grpc::CallbackServerContext* ctx,
                                           const v1::EmbeddingTransferDone* request,
                                           v1::TransferAck* response) override;
  grpc::ServerUnaryReactor* Connect(grpc::CallbackServerContext* ctx,
                                    const v1::ConnectRequest* request,
                                    v1::ConnectResponse* response) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* ctx,
                                    const v1::LoadRequest* request,
                                    v1::LoadReport* response) override;

  v1::LoadReport Load() const;
  // While draining, Encode refuses new work with UNAVAILABLE.
  void SetAccepting(bool accepting) { accepting_ = accepting; }

 private:
  const std::string instance_id_;
  EncoderCore& core_;
  transfer::TransferEngine& engine_;
  metrics::Counter* requests_ok_;
  metrics::Counter* requests_failed_;
  metrics::Histogram* encode_seconds_;
  std::atomic<bool> accepting_{true};
};

}  // namespace mmserve::encoder

#endif  // MMSERVE_ENCODER_SERVICE_ENCODER_SERVICE_H_
