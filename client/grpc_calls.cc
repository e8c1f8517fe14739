#include "client/grpc_calls.h"

#include <grpcpp/client_context.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/generic/generic_stub.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "proto/reflection.pb.h"

namespace mmserve::client {
namespace {

using ReflectionRequest = mmserve::reflection::v1alpha::ServerReflectionRequest;
using ReflectionResponse = mmserve::reflection::v1alpha::ServerReflectionResponse;

constexpr char kReflectionMethod[] =
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";

void SetDeadline(grpc::ClientContext& ctx, absl::Duration deadline) {
  if (deadline == absl::InfiniteDuration()) return;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline));
}

void SetApiKey(grpc::ClientContext& ctx, const std::string& api_key) {
  if (!api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key);
}

// Waits for `tag` on a completion queue that has only one operation in
// flight at a time; returns the operation's ok bit.
bool Await(grpc::CompletionQueue& cq, void* tag) {
  void* got = nullptr;
  bool ok = false;
  if (!cq.Next(&got, &ok)) return false;  // queue shut down
  return got == tag && ok;
}

}  // namespace

absl::Status StreamGenerate(
    mmserve::v1::Inference::StubInterface& stub, const mmserve::v1::GenerateRequest& request,
    absl::Duration deadline,
    const std::function<void(const mmserve::v1::GenerateResponse&)>& on_response,
    const std::string& api_key) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, deadline);
  SetApiKey(ctx, api_key);
  std::unique_ptr<grpc::ClientReaderInterface<mmserve::v1::GenerateResponse>> reader =
      stub.Generate(&ctx, request);
  mmserve::v1::GenerateResponse response;
  while (reader->Read(&response)) on_response(response);
  return FromGrpcStatus(reader->Finish());
}

absl::StatusOr<mmserve::v1::ListModelsResponse> ListModels(
    mmserve::v1::Inference::StubInterface& stub, absl::Duration deadline,
    const std::string& api_key) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, deadline);
  SetApiKey(ctx, api_key);
  mmserve::v1::ListModelsResponse response;
  grpc::Status status = stub.ListModels(&ctx, mmserve::v1::ListModelsRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> CheckHealth(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
    absl::Duration deadline) {
  std::unique_ptr<grpc::health::v1::Health::Stub> stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  SetDeadline(ctx, deadline);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&ctx, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.status();
}

namespace {

// One request on the reflection stream, its one response.
absl::StatusOr<ReflectionResponse> AskReflection(const std::shared_ptr<grpc::Channel>& channel,
                                                 const ReflectionRequest& request,
                                                 absl::Duration deadline) {
  grpc::TemplatedGenericStub<ReflectionRequest, ReflectionResponse> stub(channel);
  grpc::ClientContext ctx;
  SetDeadline(ctx, deadline);
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<ReflectionRequest, ReflectionResponse>> call =
      stub.PrepareCall(&ctx, kReflectionMethod, &cq);

  // One operation at a time, each tagged with its own address. A failed
  // step still ends with Finish, which carries the reason.
  ReflectionResponse response;
  int start, write, writes_done, read, finish;
  call->StartCall(&start);
  bool ok = Await(cq, &start);
  if (ok) {
    call->Write(request, &write);
    ok = Await(cq, &write);
  }
  if (ok) {
    call->WritesDone(&writes_done);
    ok = Await(cq, &writes_done);
  }
  bool got_response = false;
  if (ok) {
    call->Read(&response, &read);
    got_response = Await(cq, &read);
  }
  grpc::Status status;
  call->Finish(&status, &finish);
  Await(cq, &finish);
  cq.Shutdown();
  void* tag;
  bool drained_ok;
  while (cq.Next(&tag, &drained_ok)) {
  }

  if (!status.ok()) return FromGrpcStatus(status);
  if (!got_response) return absl::UnavailableError("server reflection: no response");
  if (response.has_error_response()) {
    return absl::Status(
        static_cast<absl::StatusCode>(response.error_response().error_code()),
        absl::StrCat("server reflection: ", response.error_response().error_message()));
  }
  return response;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ListServices(const std::shared_ptr<grpc::Channel>& channel,
                                                      absl::Duration deadline) {
  ReflectionRequest request;
  request.set_list_services("*");
  absl::StatusOr<ReflectionResponse> answer = AskReflection(channel, request, deadline);
  if (!answer.ok()) return answer.status();
  const ReflectionResponse& response = *answer;
  if (!response.has_list_services_response()) {
    return absl::InternalError("server reflection: the answer is not a service list");
  }
  std::vector<std::string> names;
  for (const auto& service : response.list_services_response().service()) {
    names.push_back(service.name());
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::vector<std::string>> FileDescriptorsContaining(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& symbol,
    absl::Duration deadline) {
  ReflectionRequest request;
  request.set_file_containing_symbol(symbol);
  absl::StatusOr<ReflectionResponse> answer = AskReflection(channel, request, deadline);
  if (!answer.ok()) return answer.status();
  if (!answer->has_file_descriptor_response()) {
    return absl::InternalError("server reflection: the answer holds no file descriptors");
  }
  const auto& files = answer->file_descriptor_response().file_descriptor_proto();
  return std::vector<std::string>(files.begin(), files.end());
}

}  // namespace mmserve::client
