#include "bench/loadgen/encoder_target.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/hash.h"
#include "proto/encoder.grpc.pb.h"
#include "transfer/transfer_engine.h"

namespace mmserve::loadgen {
namespace {

// One request in flight: the Encode call and its images' receives. The last
// of them to finish fills the Record and calls `done`.
class EncodeCall {
 public:
  EncodeCall(Record* record, const Stopwatch* clock, int pending, std::function<void()> done)
      : record_(record), clock_(clock), pending_(pending), done_(std::move(done)) {}

  grpc::ClientContext ctx;
  internal::v1::EncodeRequest request;
  internal::v1::EncodeResponse response;

  // Encode returned. Returns whether it failed (the caller cancels the
  // receives).
  bool OnEncoded(const grpc::Status& status) {
    const double now = clock_->ElapsedSeconds();
    const absl::Status s = FromGrpcStatus(status);
    {
      absl::MutexLock lock(&mu_);
      record_->encoded_s = now;
      // Encode's error wins: the receives' CANCELLED follows from it.
      if (!s.ok()) encode_error_ = s;
    }
    Finish();
    return !s.ok();
  }

  void OnReceived(const absl::Status& status, int64_t bytes) {
    {
      absl::MutexLock lock(&mu_);
      if (!status.ok() && !receive_error_) receive_error_ = status;
      sink_bytes_ += bytes;
    }
    Finish();
  }

 private:
  void Finish() {
    {
      absl::MutexLock lock(&mu_);
      if (--pending_ > 0) return;
      record_->end_s = clock_->ElapsedSeconds();
      record_->sink_bytes = sink_bytes_;
      record_->status = encode_error_ ? *encode_error_ : receive_error_.value_or(absl::OkStatus());
    }
    // Last one out: nothing else touches this call.
    std::function<void()> done = std::move(done_);
    done();
  }

  absl::Mutex mu_;
  Record* const record_;
  const Stopwatch* const clock_;
  int pending_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> encode_error_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> receive_error_ ABSL_GUARDED_BY(mu_);
  int64_t sink_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void()> done_;
};

class EncoderTarget final : public Target {
 public:
  EncoderTarget(const TargetOptions& o, const Stopwatch* clock,
                std::unique_ptr<transfer::TransferEngine> engine)
      : channel_(InternalChannel(o.address)),
        stub_(internal::v1::Encoder::NewStub(channel_)),
        address_(o.address),
        clock_(clock),
        timeout_(o.timeout),
        engine_(std::move(engine)) {}

  absl::Status Connect(absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    if (!encoder_id_.empty()) return absl::OkStatus();
    if (!channel_->WaitForConnected(std::chrono::system_clock::now() +
                                    absl::ToChronoNanoseconds(timeout))) {
      connect_error_ = absl::UnavailableError(
          absl::StrCat("no connection to ", address_, " within ", absl::FormatDuration(timeout)));
      return connect_error_;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
    internal::v1::ConnectResponse resp;
    const absl::Status rpc = FromGrpcStatus(stub_->Connect(&ctx, engine_->local_info(), &resp));
    if (!rpc.ok()) {
      connect_error_ = absl::Status(
          rpc.code(), absl::StrCat("encoder at ", address_, " refused the sink: ", rpc.message(),
                                   " (same --profile and the model's hidden size?)"));
      return connect_error_;
    }
    internal::v1::ConnectRequest peer;
    peer.set_instance_id(resp.instance_id());
    *peer.mutable_ucx() = resp.ucx();
    *peer.mutable_embedding_buffer() = resp.embedding_buffer();
    if (absl::Status s = engine_->Connect(peer); !s.ok()) {
      connect_error_ = s;
      return s;
    }
    encoder_id_ = resp.instance_id();
    return absl::OkStatus();
  }

  void Send(const WorkItem& item, Record* record, std::function<void()> done) override {
    std::string encoder;
    absl::Status refused;
    {
      absl::MutexLock lock(&mu_);
      encoder = encoder_id_;
      if (encoder.empty()) {
        refused = connect_error_.ok()
                      ? absl::FailedPreconditionError("the encoder target is not connected")
                      : connect_error_;
      }
    }
    if (refused.ok() && item.images.empty()) {
      refused = absl::InvalidArgumentError(
          "the encoder target needs requests with images (--images >= 1)");
    }
    if (!refused.ok()) {
      record->status = refused;
      record->end_s = clock_->ElapsedSeconds();
      done();
      return;
    }
    const std::string id = absl::StrCat("loadgen-enc-", next_id_++);
    const int n = static_cast<int>(item.images.size());
    // Held by the Encode callback and each receive's; the last one frees it.
    auto call = std::make_shared<EncodeCall>(record, clock_, n + 1, std::move(done));
    call->ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout_));
    call->request.set_request_id(id);
    for (int k = 0; k < n; ++k) {
      internal::v1::EncodeImage* image = call->request.add_images();
      image->set_image_index(static_cast<uint32_t>(k));
      image->mutable_image()->set_data(*item.images[k]);
      const ContentHash h = HashBytes(*item.images[k]);
      image->mutable_content_hash()->set_high(h.high);
      image->mutable_content_hash()->set_low(h.low);
    }
    const size_t bytes_per_token = engine_->buffer().layout().BytesPerToken();
    for (int k = 0; k < n; ++k) {
      transfer::ReceiveRequest rr;
      rr.request_id = id;
      rr.image_index = static_cast<uint32_t>(k);
      rr.sender = encoder;
      rr.known_tokens = 0;  // the default allocation; resumed when longer
      rr.timeout = timeout_;
      engine_->Receive(std::move(rr),
                       [call, bytes_per_token](absl::StatusOr<transfer::ReceivedMedia> image) {
                         if (!image.ok()) {
                           call->OnReceived(image.status(), 0);
                           return;
                         }
                         const int64_t bytes = int64_t{image->total_tokens()} * bytes_per_token;
                         image->Release();  // the sink keeps nothing
                         call->OnReceived(absl::OkStatus(), bytes);
                       });
    }
    stub_->async()->Encode(&call->ctx, &call->request, &call->response,
                           [this, call, id](grpc::Status status) {
                             if (call->OnEncoded(status)) {
                               engine_->Cancel(id, "the Encode call failed");
                             }
                           });
  }

  absl::Status Drained(absl::Duration timeout) override {
    const Deadline deadline = Deadline::After(timeout);
    for (;;) {
      const transfer::TransferEngine::Counts c = engine_->counts();
      const uint32_t used = engine_->allocator().used_blocks();
      if (used == 0 && c.receiving == 0 && c.quarantined == 0) return absl::OkStatus();
      if (deadline.Expired()) {
        return absl::FailedPreconditionError(absl::StrCat("the sink still holds ", used,
                                                          " blocks, ", c.receiving, " transfers, ",
                                                          c.quarantined, " quarantined runs"));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<internal::v1::Encoder::Stub> stub_;
  const std::string address_;
  const Stopwatch* const clock_;
  const absl::Duration timeout_;
  std::unique_ptr<transfer::TransferEngine> engine_;
  absl::Mutex mu_;
  std::string encoder_id_ ABSL_GUARDED_BY(mu_);  // set once Connect succeeded
  absl::Status connect_error_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> next_id_{0};
};

}  // namespace

absl::StatusOr<std::unique_ptr<Target>> MakeEncoderTarget(const TargetOptions& options,
                                                          const Stopwatch* clock) {
  if (options.hidden_size == 0) {
    return absl::InvalidArgumentError("the encoder target needs the model's hidden size");
  }
  if (options.sink_blocks == 0) {
    return absl::InvalidArgumentError("the encoder target's sink needs at least one block");
  }
  auto profile = transfer::ParseTransportProfile(options.profile);
  if (!profile.ok()) return profile.status();
  transfer::TransferEngineOptions to;
  // Unique per process: the encoder keys its peers by instance id.
  to.instance_id = absl::StrCat("loadgen-sink-", getpid());
  to.profile = *profile;
  to.layout.block_size = 128;
  to.layout.num_blocks = options.sink_blocks;
  to.layout.hidden_size = options.hidden_size;
  to.layout.dtype_bytes = sizeof(float);
  to.default_num_blocks = std::min<uint32_t>(8, options.sink_blocks);
  auto engine = transfer::TransferEngine::Create(to);
  if (!engine.ok()) return engine.status();
  return std::make_unique<EncoderTarget>(options, clock, std::move(*engine));
}

}  // namespace mmserve::loadgen
