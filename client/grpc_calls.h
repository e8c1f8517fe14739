// The client side of the calls the command-line tools make: streaming
// Generate, ListModels, grpc.health.v1 Check, and server reflection's
// ListServices.
//
//   std::shared_ptr<grpc::Channel> channel =
//       grpc::CreateChannel("localhost:50051", grpc::InsecureChannelCredentials());
//   auto stub = mmserve::v1::Inference::NewStub(channel);
//   absl::Status s = StreamGenerate(*stub, request, absl::Seconds(30),
//                                   [](const mmserve::v1::GenerateResponse& r) {
//                                     std::cout << r.text() << std::flush;
//                                   });
//   ASSIGN_OR_RETURN(std::vector<std::string> services,
//                    ListServices(channel, absl::Seconds(5)));
//
// Errors come back as absl::Status with the gRPC code and message. A
// deadline of absl::InfiniteDuration() sets none. Each call is blocking and
// thread-safe (channels and stubs are).
#ifndef MMSERVE_CLIENT_GRPC_CALLS_H_
#define MMSERVE_CLIENT_GRPC_CALLS_H_

#include <grpcpp/channel.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/health.grpc.pb.h"
#include "proto/inference.grpc.pb.h"

namespace mmserve::client {

// Calls Generate and hands every response to on_response as it arrives.
// Returns the call's final status. A non-empty `api_key` goes as metadata
// "authorization: Bearer <api_key>" (the router's --api_key).
[[nodiscard]] absl::Status StreamGenerate(
    mmserve::v1::Inference::StubInterface& stub, const mmserve::v1::GenerateRequest& request,
    absl::Duration deadline,
    const std::function<void(const mmserve::v1::GenerateResponse&)>& on_response,
    const std::string& api_key = "");

[[nodiscard]] absl::StatusOr<mmserve::v1::ListModelsResponse> ListModels(
    mmserve::v1::Inference::StubInterface& stub, absl::Duration deadline,
    const std::string& api_key = "");

// grpc.health.v1.Health/Check for `service` ("" = the whole server).
[[nodiscard]] absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> CheckHealth(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
    absl::Duration deadline);

// The fully qualified names of the services the server exposes, sorted, via
// grpc.reflection.v1alpha.ServerReflection (what `grpcurl list` shows).
// UNIMPLEMENTED when the server has no reflection service.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ListServices(
    const std::shared_ptr<grpc::Channel>& channel, absl::Duration deadline);

// The serialized FileDescriptorProtos reflection gives for `symbol` (e.g.
// "grpc.health.v1.Health"): its file and the files it imports.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> FileDescriptorsContaining(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& symbol,
    absl::Duration deadline);

}  // namespace mmserve::client

#endif  // MMSERVE_CLIENT_GRPC_CALLS_H_
