// A TokenBatch stream from a language instance, as a gRPC client reactor:
// PrefillStream (Language.Prefill, roles both and prefill), DecodeStream
// (Language.Decode, role decode) or ElasticStream (Language.ElasticPrefill, one
// member of an elastic group). Each batch and the end go to the
// handlers, on gRPC's threads; the handlers are dropped after on_done.
//
//   auto stream = std::make_shared<PrefillStream>(request, deadline, handlers);
//   ... // release the caller's lock: gRPC may react inline
//   stream->Begin(stream, *instance->language);
//   stream->Cancel();  // any time after Begin; on_done still follows
//
// Begin once; Cancel is thread-safe.
#ifndef MMSERVE_ROUTER_TOKEN_STREAM_H_
#define MMSERVE_ROUTER_TOKEN_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <utility>

#include "proto/language.grpc.pb.h"

namespace mmserve::router {

struct TokenStreamHandlers {
  std::function<void(const internal::v1::TokenBatch&)> on_batch;
  std::function<void(const grpc::Status&)> on_done;
};

// The RPC that a stream's request type starts.
inline void StartTokenRpc(internal::v1::Language::Stub& stub, grpc::ClientContext* ctx,
                          const internal::v1::PrefillRequest* request,
                          grpc::ClientReadReactor<internal::v1::TokenBatch>* reactor) {
  stub.async()->Prefill(ctx, request, reactor);
}
inline void StartTokenRpc(internal::v1::Language::Stub& stub, grpc::ClientContext* ctx,
                          const internal::v1::DecodeRequest* request,
                          grpc::ClientReadReactor<internal::v1::TokenBatch>* reactor) {
  stub.async()->Decode(ctx, request, reactor);
}
inline void StartTokenRpc(internal::v1::Language::Stub& stub, grpc::ClientContext* ctx,
                          const internal::v1::ElasticPrefillRequest* request,
                          grpc::ClientReadReactor<internal::v1::TokenBatch>* reactor) {
  stub.async()->ElasticPrefill(ctx, request, reactor);
}

template <typename Request>
class TokenStream final : public grpc::ClientReadReactor<internal::v1::TokenBatch> {
 public:
  TokenStream(Request request, std::chrono::system_clock::time_point deadline,
              TokenStreamHandlers handlers)
      : request_(std::move(request)), handlers_(std::move(handlers)) {
    ctx_.set_deadline(deadline);
  }
  TokenStream(const TokenStream&) = delete;
  TokenStream& operator=(const TokenStream&) = delete;

  // `self` keeps the stream alive until gRPC is done with it (OnDone).
  void Begin(std::shared_ptr<TokenStream> self, internal::v1::Language::Stub& stub) {
    self_ = std::move(self);
    StartTokenRpc(stub, &ctx_, &request_, this);
    StartRead(&batch_);
    StartCall();
  }
  void Cancel() { ctx_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    handlers_.on_batch(batch_);
    StartRead(&batch_);
  }
  void OnDone(const grpc::Status& status) override {
    handlers_.on_done(status);
    handlers_ = {};
    self_.reset();  // may destroy this
  }

 private:
  const Request request_;
  TokenStreamHandlers handlers_;
  std::shared_ptr<TokenStream> self_;
  grpc::ClientContext ctx_;
  internal::v1::TokenBatch batch_;
};

using PrefillStream = TokenStream<internal::v1::PrefillRequest>;
using DecodeStream = TokenStream<internal::v1::DecodeRequest>;
using ElasticStream = TokenStream<internal::v1::ElasticPrefillRequest>;

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_TOKEN_STREAM_H_
