// The generated messages and stubs work over a real gRPC channel: streaming,
// status codes, proto3 optional presence and oneofs.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "common/grpc_status.h"
#include "proto/encoder.grpc.pb.h"
#include "proto/inference.grpc.pb.h"
#include "proto/language.grpc.pb.h"

namespace mmserve {
namespace {

using v1::GenerateRequest;
using v1::GenerateResponse;

// Streams one response per word of the first text part, then a final one.
class EchoInference final : public v1::Inference::Service {
 public:
  grpc::Status Generate(grpc::ServerContext*, const GenerateRequest* req,
                        grpc::ServerWriter<GenerateResponse>* writer) override {
    if (!req->has_chat() || req->chat().messages().empty()) {
      return ToGrpcStatus(absl::InvalidArgumentError("chat must have at least one message"));
    }
    if (req->sampling().has_temperature() && req->sampling().temperature() < 0) {
      return ToGrpcStatus(absl::InvalidArgumentError("temperature must be >= 0"));
    }
    const std::string& text = req->chat().messages(0).content(0).text();
    size_t start = 0;
    uint32_t n = 0;
    while (start < text.size()) {
      size_t end = text.find(' ', start);
      if (end == std::string::npos) end = text.size();
      GenerateResponse r;
      r.set_request_id(req->request_id());
      r.set_text(text.substr(start, end - start));
      r.add_token_ids(n++);
      writer->Write(r);
      start = end + 1;
    }
    GenerateResponse last;
    last.set_request_id(req->request_id());
    last.set_finish_reason(v1::FINISH_REASON_STOP);
    last.mutable_usage()->set_completion_tokens(n);
    writer->Write(last);
    return grpc::Status::OK;
  }

  grpc::Status ListModels(grpc::ServerContext*, const v1::ListModelsRequest*,
                          v1::ListModelsResponse* resp) override {
    auto* m = resp->add_models();
    m->set_id("demo");
    m->set_vision(true);
    m->set_max_model_len(4096);
    return grpc::Status::OK;
  }
};

struct Server {
  EchoInference service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::Inference::Stub> stub;

  Server() {
    grpc::ServerBuilder builder;
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    stub = v1::Inference::NewStub(server->InProcessChannel(grpc::ChannelArguments()));
  }
  ~Server() { server->Shutdown(); }
};

GenerateRequest ChatRequest(const std::string& text) {
  GenerateRequest req;
  req.set_request_id("req-1");
  auto* msg = req.mutable_chat()->add_messages();
  msg->set_role("user");
  msg->add_content()->set_text(text);
  msg->add_content()->mutable_image()->set_data(std::string("\x89PNG", 4));
  return req;
}

TEST_CASE("Generate streams every response then OK", "[grpc]") {
  Server s;
  grpc::ClientContext ctx;
  auto reader = s.stub->Generate(&ctx, ChatRequest("a b c"));
  std::vector<GenerateResponse> got;
  GenerateResponse r;
  while (reader->Read(&r)) got.push_back(r);
  REQUIRE(reader->Finish().ok());
  REQUIRE(got.size() == 4);
  CHECK(got[0].text() == "a");
  CHECK(got[2].text() == "c");
  CHECK(got[2].token_ids(0) == 2);
  CHECK(got[3].finish_reason() == v1::FINISH_REASON_STOP);
  CHECK(got[3].usage().completion_tokens() == 3);
  CHECK(got[3].request_id() == "req-1");
}

TEST_CASE("an invalid request ends the stream with INVALID_ARGUMENT and its message", "[grpc]") {
  Server s;
  GenerateRequest req = ChatRequest("x");
  req.mutable_sampling()->set_temperature(-1);
  grpc::ClientContext ctx;
  auto reader = s.stub->Generate(&ctx, req);
  GenerateResponse r;
  CHECK_FALSE(reader->Read(&r));
  grpc::Status st = reader->Finish();
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(st.error_message() == "temperature must be >= 0");
}

TEST_CASE("proto3 optional sampling fields distinguish unset from zero", "[grpc]") {
  v1::SamplingParams p;
  CHECK_FALSE(p.has_temperature());
  p.set_temperature(0.0f);  // greedy, explicitly
  CHECK(p.has_temperature());
  v1::SamplingParams back;
  REQUIRE(back.ParseFromString(p.SerializeAsString()));
  CHECK(back.has_temperature());
  CHECK_FALSE(back.has_top_p());
  CHECK_FALSE(back.has_seed());
}

TEST_CASE("ListModels answers over the channel", "[grpc]") {
  Server s;
  grpc::ClientContext ctx;
  v1::ListModelsResponse resp;
  REQUIRE(s.stub->ListModels(&ctx, v1::ListModelsRequest(), &resp).ok());
  REQUIRE(resp.models_size() == 1);
  CHECK(resp.models(0).id() == "demo");
  CHECK(resp.models(0).vision());
}

TEST_CASE("internal transfer descriptors round-trip byte-exact", "[grpc]") {
  internal::v1::EmbeddingTransferInit init;
  init.set_request_id("r");
  init.set_image_index(2);
  init.mutable_image_hash()->set_high(0xfedcba9876543210ULL);
  init.mutable_allocation()->set_start_block(5);
  init.mutable_allocation()->set_num_blocks(3);
  init.mutable_allocation()->set_num_tokens(300);
  internal::v1::EmbeddingTransferInit back;
  REQUIRE(back.ParseFromString(init.SerializeAsString()));
  CHECK(back.image_hash().high() == 0xfedcba9876543210ULL);
  CHECK(back.allocation().num_tokens() == 300);

  internal::v1::KvCommit commit;
  commit.add_rank_crc32c(0xdeadbeef);
  commit.set_mrope_position_delta(-37);
  internal::v1::KvCommit cback;
  REQUIRE(cback.ParseFromString(commit.SerializeAsString()));
  CHECK(cback.rank_crc32c(0) == 0xdeadbeefu);
  CHECK(cback.mrope_position_delta() == -37);
}

}  // namespace
}  // namespace mmserve
