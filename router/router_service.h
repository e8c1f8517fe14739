// The router's gRPC services: the public Inference API (Generate streams
// through GenerateCall; ListModels) and the internal Registry that instances
// register and heartbeat with. Live calls are tracked so that an instance
// going down reaches every call that uses it. Thread-safe.
#ifndef MMSERVE_ROUTER_ROUTER_SERVICE_H_
#define MMSERVE_ROUTER_ROUTER_SERVICE_H_

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/inference.grpc.pb.h"
#include "proto/registry.grpc.pb.h"
#include "router/choice_calls.h"
#include "router/generate_call.h"
#include "router/instance_table.h"

namespace mmserve::router {

// Live calls by id, for instance-down fan-out and draining.
class CallTracker {
 public:
  void Add(const std::shared_ptr<GenerateCall>& call);
  void Remove(const std::string& id);
  void OnInstanceDown(const std::string& instance_id);
  void CancelAll(const std::string& reason);
  size_t size() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::weak_ptr<GenerateCall>> calls_ ABSL_GUARDED_BY(mu_);
};

// Cancels a started request (every choice of it).
using CallCancel = ChoiceCalls::Cancel;
// A started request: its id and its cancel.
using StartedCall = ChoiceCalls::StartedCall;

// Starts a request's call, or with n > 1 its choices' calls
// (router/choice_calls.h); each call's end unregisters it from `tracker`
// before the sink's own on_end runs.
StartedCall StartTrackedCall(const RouterContext& context, CallTracker& tracker,
                             mmserve::v1::GenerateRequest request, CallSink sink,
                             std::chrono::system_clock::time_point deadline);

class InferenceService final : public mmserve::v1::Inference::CallbackService {
 public:
  InferenceService(const RouterContext& context, CallTracker& tracker)
      : context_(context), tracker_(tracker) {}

  grpc::ServerWriteReactor<mmserve::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* ctx, const mmserve::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* ctx,
                                       const mmserve::v1::ListModelsRequest* request,
                                       mmserve::v1::ListModelsResponse* response) override;

 private:
  const RouterContext& context_;
  CallTracker& tracker_;
};

// The served model as ListModels (and GET /v1/models) describe it.
mmserve::v1::ListModelsResponse DescribeModels(const RouterContext& context);

class RegistryService final : public iv1::Registry::CallbackService {
 public:
  explicit RegistryService(InstanceTable& table) : table_(table) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const iv1::RegisterRequest* request,
                                     iv1::RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const iv1::HeartbeatRequest* request,
                                      iv1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Deregister(grpc::CallbackServerContext* ctx,
                                       const iv1::DeregisterRequest* request,
                                       iv1::DeregisterResponse* response) override;

 private:
  InstanceTable& table_;
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_ROUTER_SERVICE_H_
