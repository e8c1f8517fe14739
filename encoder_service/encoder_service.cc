#include "encoder_service/encoder_service.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/grpc_status.h"
#include "common/internal_plane.h"
#include "common/logging.h"
#include "common/server_stream.h"

namespace mmserve::encoder {
namespace {

// Encode's reactor: a client cancel (or deadline) drops the job's queued
// images. Finish runs exactly once, from the core's done callback.
class EncodeReactor final : public grpc::ServerUnaryReactor {
 public:
  EncodeReactor(EncoderCore& core, std::string transfer_id)
      : core_(core), transfer_id_(std::move(transfer_id)) {}
  void OnCancel() override { core_.Cancel(transfer_id_); }
  void OnDone() override { delete this; }

 private:
  EncoderCore& core_;
  const std::string transfer_id_;
};

}  // namespace

EncoderService::EncoderService(std::string instance_id, EncoderCore& core,
                               transfer::TransferEngine& engine, metrics::Registry& metrics)
    : instance_id_(std::move(instance_id)), core_(core), engine_(engine) {
  requests_ok_ = &metrics.GetCounter("mmserve_encoder_requests_total", "Encode calls by result.",
                                     {{"code", "OK"}});
  requests_failed_ = &metrics.GetCounter("mmserve_encoder_requests_total",
                                         "Encode calls by result.", {{"code", "error"}});
  encode_seconds_ = &metrics.GetHistogram("mmserve_encoder_encode_seconds",
                                          "Encode call latency (all images published).",
                                          metrics::LatencyBuckets());
}

grpc::ServerUnaryReactor* EncoderService::Encode(grpc::CallbackServerContext* ctx,
                                                 const v1::EncodeRequest* request,
                                                 v1::EncodeResponse* response) {
  return ServeInternal(ctx, [&]() -> grpc::ServerUnaryReactor* {
    if (!accepting_) {
      return FinishUnary(ctx, grpc::Status(grpc::StatusCode::UNAVAILABLE, "encoder is draining"));
    }
    // The router names the transfer in the request id it sends here.
    EncodeJob job;
    job.request_id = request->request_id();
    job.transfer_id = request->request_id();
    for (const v1::EncodeImage& image : request->images()) {
      job.images.push_back({image.image_index(), image.image().data(),
                            ContentHash{image.content_hash().high(), image.content_hash().low()},
                            image.has_video()
                                ? std::make_shared<const mmserve::v1::Video>(image.video())
                                : nullptr});
    }
    auto* reactor = new EncodeReactor(core_, job.transfer_id);
    const size_t num_images = job.images.size();
    core_.Encode(std::move(job), [this, reactor, response, num_images, id = request->request_id(),
                                  clock = Stopwatch()](absl::StatusOr<v1::EncodeResponse> r) {
      encode_seconds_->Observe(clock.ElapsedSeconds());
      int hits = 0;
      if (r.ok()) {
        for (const auto& e : r->images()) hits += e.cache_hit() ? 1 : 0;
        *response = std::move(*r);
        requests_ok_->Increment();
      } else {
        requests_failed_->Increment();
      }
      LOG(INFO) << "encode " << id << ": " << num_images << " images, " << hits << " cached, "
                << absl::StrFormat("%.1f ms", clock.ElapsedSeconds() * 1e3) << ", "
                << (r.ok() ? "OK" : r.status().ToString());
      reactor->Finish(ToGrpcStatus(r.status()));
    });
    return reactor;
  });
}

grpc::ServerUnaryReactor* EncoderService::StartTransfer(grpc::CallbackServerContext* ctx,
                                                        const v1::EmbeddingTransferInit*,
                                                        v1::TransferAck*) {
  return ServeInternal(ctx, [&] {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "transfer control travels as UCX active messages");
  });
}

grpc::ServerUnaryReactor* EncoderService::ResumeTransfer(grpc::CallbackServerContext* ctx,
                                                         const v1::EmbeddingTransferResume*,
                                                         v1::TransferAck*) {
  return ServeInternal(ctx, [&] {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "transfer control travels as UCX active messages");
  });
}

grpc::ServerUnaryReactor* EncoderService::FinishTransfer(grpc::CallbackServerContext* ctx,
                                                         const v1::EmbeddingTransferDone*,
                                                         v1::TransferAck*) {
  return ServeInternal(ctx, [&] {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "transfer control travels as UCX active messages");
  });
}

grpc::ServerUnaryReactor* EncoderService::CancelTransfer(grpc::CallbackServerContext* ctx,
                                                         const v1::EmbeddingTransferCancel* request,
                                                         v1::TransferAck* response) {
  return ServeInternal(ctx, [&] {
    core_.Cancel(request->request_id());
    response->set_accepted(true);
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* EncoderService::Connect(grpc::CallbackServerContext* ctx,
                                                  const v1::ConnectRequest* request,
                                                  v1::ConnectResponse* response) {
  return ServeInternal(ctx, [&] {
    absl::Status s = engine_.Connect(*request);
    if (s.ok()) {
      const v1::ConnectRequest& local = engine_.local_info();
      response->set_instance_id(local.instance_id());
      *response->mutable_ucx() = local.ucx();
      *response->mutable_embedding_buffer() = local.embedding_buffer();
      LOG(INFO) << "connected language instance " << request->instance_id() << " over "
                << request->ucx().transport_profile();
    }
    return ToGrpcStatus(s);
  });
}

v1::LoadReport EncoderService::Load() const {
  v1::LoadReport load;
  load.set_instance_id(instance_id_);
  load.set_waiting(static_cast<uint32_t>(core_.num_pending()));
  load.set_embedding_blocks_free(engine_.allocator().free_blocks());
  load.set_encoder_cache_entries(static_cast<uint32_t>(core_.cache_stats().entries));
  load.set_accepting(accepting_);
  return load;
}

grpc::ServerUnaryReactor* EncoderService::GetLoad(grpc::CallbackServerContext* ctx,
                                                  const v1::LoadRequest*,
                                                  v1::LoadReport* response) {
  return ServeInternal(ctx, [&] {
    *response = Load();
    return grpc::Status::OK;
  });
}

}  // namespace mmserve::encoder
