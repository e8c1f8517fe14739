#include "client/grpc_calls.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace mmserve::client {
namespace {

// Streams the prompt back one word per response; model "bad" is refused,
// model "slow" waits until the call is cancelled or times out.
class FakeInference final : public mmserve::v1::Inference::Service {
 public:
  grpc::Status Generate(grpc::ServerContext* ctx, const mmserve::v1::GenerateRequest* request,
                        grpc::ServerWriter<mmserve::v1::GenerateResponse>* writer) override {
    if (request->model() == "bad") {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "unknown model \"bad\"");
    }
    if (request->model() == "slow") {
      while (!ctx->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return grpc::Status(grpc::StatusCode::CANCELLED, "gone");
    }
    const std::string& text = request->chat().messages(0).content(0).text();
    for (size_t start = 0; start < text.size();) {
      size_t end = text.find(' ', start);
      end = end == std::string::npos ? text.size() : end + 1;
      mmserve::v1::GenerateResponse r;
      r.set_request_id("fake-1");
      r.set_text(text.substr(start, end - start));
      writer->Write(r);
      start = end;
    }
    mmserve::v1::GenerateResponse last;
    last.set_request_id("fake-1");
    last.set_finish_reason(mmserve::v1::FINISH_REASON_STOP);
    last.mutable_usage()->set_completion_tokens(3);
    writer->Write(last);
    return grpc::Status::OK;
  }

  grpc::Status ListModels(grpc::ServerContext*, const mmserve::v1::ListModelsRequest*,
                          mmserve::v1::ListModelsResponse* response) override {
    response->add_models()->set_id("shapes-demo");
    return grpc::Status::OK;
  }
};

// An in-process server on a free loopback port, with the default health
// service and server reflection, as the services will run.
struct TestServer {
  TestServer() {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    REQUIRE(server != nullptr);
    channel =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  }
  ~TestServer() { server->Shutdown(); }

  FakeInference service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  std::shared_ptr<grpc::Channel> channel;
};

mmserve::v1::GenerateRequest Chat(const std::string& model, const std::string& text) {
  mmserve::v1::GenerateRequest request;
  request.set_model(model);
  mmserve::v1::ChatMessage* m = request.mutable_chat()->add_messages();
  m->set_role("user");
  m->add_content()->set_text(text);
  return request;
}

TEST_CASE("StreamGenerate hands over every response in order", "[grpc_calls]") {
  TestServer server;
  auto stub = mmserve::v1::Inference::NewStub(server.channel);
  std::vector<std::string> texts;
  mmserve::v1::GenerateResponse last;
  absl::Status status = StreamGenerate(*stub, Chat("m", "top left corner"), absl::Seconds(10),
                                       [&](const mmserve::v1::GenerateResponse& r) {
                                         texts.push_back(r.text());
                                         last = r;
                                       });
  REQUIRE(status.ok());
  CHECK(texts == std::vector<std::string>{"top ", "left ", "corner", ""});
  CHECK(last.finish_reason() == mmserve::v1::FINISH_REASON_STOP);
  CHECK(last.usage().completion_tokens() == 3);
}

TEST_CASE("StreamGenerate returns the server's code and message, and honours deadlines",
          "[grpc_calls]") {
  TestServer server;
  auto stub = mmserve::v1::Inference::NewStub(server.channel);
  int calls = 0;
  auto count = [&](const mmserve::v1::GenerateResponse&) { ++calls; };
  absl::Status bad = StreamGenerate(*stub, Chat("bad", "x"), absl::Seconds(10), count);
  CHECK(bad.code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.message() == "unknown model \"bad\"");

  absl::Time start = absl::Now();
  absl::Status slow = StreamGenerate(*stub, Chat("slow", "x"), absl::Milliseconds(200), count);
  CHECK(slow.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::Now() - start < absl::Seconds(5));
  CHECK(calls == 0);
}

TEST_CASE("ListModels returns the served models", "[grpc_calls]") {
  TestServer server;
  auto stub = mmserve::v1::Inference::NewStub(server.channel);
  absl::StatusOr<mmserve::v1::ListModelsResponse> models = ListModels(*stub, absl::Seconds(10));
  REQUIRE(models.ok());
  REQUIRE(models->models_size() == 1);
  CHECK(models->models(0).id() == "shapes-demo");
}

TEST_CASE("CheckHealth reads grpc++'s default health service", "[grpc_calls]") {
  using grpc::health::v1::HealthCheckResponse;
  TestServer server;
  auto whole = CheckHealth(server.channel, "", absl::Seconds(10));
  REQUIRE(whole.ok());
  CHECK(*whole == HealthCheckResponse::SERVING);

  // Per-service status is whatever the server set; unknown services are
  // NOT_FOUND.
  auto unknown = CheckHealth(server.channel, "mmserve.v1.Nothing", absl::Seconds(10));
  CHECK(unknown.status().code() == absl::StatusCode::kNotFound);
  server.server->GetHealthCheckService()->SetServingStatus("mmserve.v1.Inference", false);
  auto inference = CheckHealth(server.channel, "mmserve.v1.Inference", absl::Seconds(10));
  REQUIRE(inference.ok());
  CHECK(*inference == HealthCheckResponse::NOT_SERVING);
  server.server->GetHealthCheckService()->SetServingStatus("mmserve.v1.Inference", true);
  CHECK(*CheckHealth(server.channel, "mmserve.v1.Inference", absl::Seconds(10)) ==
        HealthCheckResponse::SERVING);
}

TEST_CASE("ListServices lists what server reflection exposes", "[grpc_calls]") {
  TestServer server;
  absl::StatusOr<std::vector<std::string>> services =
      ListServices(server.channel, absl::Seconds(10));
  REQUIRE(services.ok());
  CHECK(std::find(services->begin(), services->end(), "mmserve.v1.Inference") != services->end());
  CHECK(std::find(services->begin(), services->end(), "grpc.reflection.v1alpha.ServerReflection") !=
        services->end());
  CHECK(std::is_sorted(services->begin(), services->end()));
}

TEST_CASE("calls to a dead address fail with UNAVAILABLE", "[grpc_calls]") {
  int port;
  {
    TestServer gone;
    port = gone.port;
  }
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  CHECK(CheckHealth(channel, "", absl::Seconds(5)).status().code() ==
        absl::StatusCode::kUnavailable);
  CHECK(ListServices(channel, absl::Seconds(5)).status().code() == absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace mmserve::client
