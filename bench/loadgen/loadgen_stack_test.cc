// The load generator against a real stack (router, encoder, language as
// separate processes, started with the launcher): 200 demo requests at
// 20 req/s end to end over gRPC and over HTTP, 200 text-only requests
// straight at the language instance, and 200 demo images straight at the
// encoder with their embeddings received over UCX into loadgen's sink, each
// with zero errors and zero leaked blocks afterwards (the services' from
// their metrics, the sink's from its allocator); p99 latencies printed,
// never asserted. Also the rejection paths: errors are counted by their
// gRPC code.
#include <catch2/catch.hpp>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "bench/loadgen/runner.h"
#include "bench/loadgen/stats.h"
#include "bench/loadgen/target.h"
#include "bench/loadgen/workload.h"
#include "common/clock.h"
#include "model/model_config.h"
#include "tests/stack_harness.h"

namespace mmserve::loadgen {
namespace {

uint32_t DemoHiddenSize() {
  auto config = model::LoadModelConfig(testing::DemoModelDir());
  REQUIRE(config.ok());
  return static_cast<uint32_t>(config->text.hidden_size);
}

Summary RunAndReport(const std::string& name, const TargetOptions& to, const WorkloadSpec& spec,
                     const RunOptions& ro) {
  auto workload = BuildWorkload(spec);
  REQUIRE(workload.ok());
  Stopwatch clock;
  auto target = MakeTarget(to, &clock);
  REQUIRE(target.ok());
  const absl::Status connected = (*target)->Connect(absl::Seconds(10));
  INFO(connected);
  REQUIRE(connected.ok());
  std::vector<Record> records = RunLoad(**target, *workload, ro, clock);
  // Whatever the target holds here (the encoder sink's blocks) is back.
  const absl::Status drained = (*target)->Drained(absl::Seconds(10));
  INFO(name << ": " << drained);
  CHECK(drained.ok());
  const Summary s = Summarize(records, {});
  std::printf("== %s\n%s%s\n", name.c_str(), FormatTable(s, {}).c_str(),
              FormatJson(s, {}, {{"label", absl::StrCat("\"", name, "\"")}}).c_str());
  for (const Record& r : records) {
    INFO(name << " request " << r.item << ": " << r.status);
    REQUIRE(r.status.ok());
  }
  return s;
}

TEST_CASE("200 requests at 20 req/s to each service: zero errors, zero leaked blocks") {
  auto stack = launcher::LocalStack::Start(testing::TestStackOptions(1, "shm"));
  REQUIRE(stack.ok());
  launcher::LocalStack& s = **stack;
  const RunOptions ro{.request_rate = 20, .max_duration = absl::Seconds(60)};

  WorkloadSpec demo;
  demo.num_requests = 200;
  demo.eval_dir = testing::EvalDir();
  const Summary grpc =
      RunAndReport("router gRPC", {.kind = "router", .address = s.router_address()}, demo, ro);
  CHECK(grpc.ok == 200);
  CHECK(grpc.ttft_ms.n == 200);
  const Summary http = RunAndReport(
      "router HTTP", {.kind = "http", .address = absl::StrCat("127.0.0.1:", s.http_port())}, demo,
      ro);
  CHECK(http.ok == 200);
  CHECK(http.output_tokens > 0);

  WorkloadSpec text;
  text.dataset = "synthetic";
  text.num_requests = 200;
  text.images = 0;
  text.prompt_tokens = 32;
  text.output_tokens = 8;
  const Summary lang = RunAndReport(
      "language Prefill", {.kind = "language", .address = s.language().grpc_address()}, text, ro);
  CHECK(lang.ok == 200);
  CHECK(lang.output_tokens == 200 * 8);  // EOS ignored: exactly output_tokens each

  // Fresh images straight at the encoder, into loadgen's UCX sink (the demo
  // set's few images are in the encoder's cache by now).
  WorkloadSpec images;
  images.dataset = "synthetic";
  images.num_requests = 200;
  images.images = 1;
  images.image_width = 112;
  images.image_height = 112;
  const int encoder_metrics = s.encoder(0).metrics_port();
  const double encoded_before =
      testing::ScrapeMetric(encoder_metrics, "mmserve_encoder_requests_total", "code=\"OK\"");
  const double sent_before =
      testing::ScrapeMetric(encoder_metrics, "mmserve_encoder_transfer_bytes_total");
  const TargetOptions enc{.kind = "encoder",
                          .address = s.encoder(0).grpc_address(),
                          .hidden_size = DemoHiddenSize(),
                          .profile = "shm"};
  const Summary encode = RunAndReport("encoder Encode + UCX sink", enc, images, ro);
  CHECK(encode.ok == 200);
  CHECK(encode.encode_ms.n == 200);
  CHECK(encode.e2e_ms.n == 200);
  // Every image's embeddings arrived whole: the sink received what the
  // encoder counts as sent (its counter moves when the sender's side of the
  // transfer completes, just after the sink's), in whole tokens (an
  // embedding of hidden_size floats and 28 bytes of fill id, M-RoPE and aux).
  CHECK(encode.sink_bytes > 0);
  CHECK(encode.sink_bytes % (enc.hidden_size * 4 + 28) == 0);
  double sent = 0;
  for (const Deadline d = Deadline::After(absl::Seconds(5)); !d.Expired();
       absl::SleepFor(absl::Milliseconds(50))) {
    sent = testing::ScrapeMetric(encoder_metrics, "mmserve_encoder_transfer_bytes_total") -
           sent_before;
    if (sent >= encode.sink_bytes) break;
  }
  CHECK(sent == encode.sink_bytes);
  CHECK(testing::ScrapeMetric(encoder_metrics, "mmserve_encoder_requests_total", "code=\"OK\"") ==
        encoded_before + 200);
  CHECK(testing::ScrapeMetric(encoder_metrics, "mmserve_encoder_embedding_blocks_used") == 0);

  // A sink of another hidden size is refused by the encoder's Connect, and
  // then every request fails with that code; text-only items are refused.
  {
    Stopwatch clock;
    TargetOptions wrong = enc;
    wrong.hidden_size = enc.hidden_size + 1;
    auto target = MakeTarget(wrong, &clock);
    REQUIRE(target.ok());
    CHECK((*target)->Connect(absl::Seconds(10)).code() == absl::StatusCode::kInvalidArgument);
    WorkloadSpec few = demo;
    few.num_requests = 3;
    auto w = BuildWorkload(few);
    REQUIRE(w.ok());
    const Summary refused = Summarize(RunLoad(**target, *w, {}, clock), {});
    CHECK(refused.errors_by_code.at("INVALID_ARGUMENT") == 3);
    auto right = MakeTarget(enc, &clock);
    REQUIRE(right.ok());
    REQUIRE((*right)->Connect(absl::Seconds(10)).ok());
    WorkloadSpec textonly = text;
    textonly.num_requests = 2;
    auto t = BuildWorkload(textonly);
    REQUIRE(t.ok());
    const Summary no_images = Summarize(RunLoad(**right, *t, {}, clock), {});
    CHECK(no_images.errors_by_code.at("INVALID_ARGUMENT") == 2);
    // Bytes that are no image: Encode fails INVALID_ARGUMENT, the sink's
    // receives already posted for them are cancelled, nothing stays held.
    const std::string junk = "not an image";
    Workload bad;
    for (int i = 0; i < 3; ++i) {
      WorkItem item;
      item.images = {&junk, &junk};
      item.text = "what is this";
      bad.items.push_back(item);
    }
    const Summary rejected = Summarize(RunLoad(**right, bad, {}, clock), {});
    CHECK(rejected.errors_by_code.at("INVALID_ARGUMENT") == 3);
    CHECK(rejected.sink_bytes == 0);
    CHECK((*right)->Drained(absl::Seconds(10)).ok());
  }

  const testing::Leaks leaks = testing::WaitForNoLeaks(s, absl::Seconds(10));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
}

TEST_CASE("errors are counted by gRPC code, and bad options are refused") {
  Stopwatch clock;
  // Nothing listens on port 1: every request fails UNAVAILABLE, quickly.
  auto target =
      MakeTarget({.kind = "router", .address = "127.0.0.1:1", .timeout = absl::Seconds(5)}, &clock);
  REQUIRE(target.ok());
  WorkloadSpec spec;
  spec.dataset = "synthetic";
  spec.num_requests = 5;
  spec.images = 1;
  spec.image_width = 32;
  spec.image_height = 32;
  auto w = BuildWorkload(spec);
  REQUIRE(w.ok());
  CHECK((*target)->Connect(absl::Milliseconds(300)).code() == absl::StatusCode::kUnavailable);
  const Summary s = Summarize(RunLoad(**target, *w, {.max_concurrency = 2}, clock), {});
  CHECK(s.ok == 0);
  CHECK(s.errors_by_code.at("UNAVAILABLE") == 5);
  CHECK(s.goodput == 0);

  // The language target takes text only: images are refused before sending.
  auto lang = MakeTarget({.kind = "language", .address = "127.0.0.1:1"}, &clock);
  REQUIRE(lang.ok());
  const Summary l = Summarize(RunLoad(**lang, *w, {}, clock), {});
  CHECK(l.errors_by_code.at("INVALID_ARGUMENT") == 5);

  CHECK(MakeTarget({.kind = "unknown", .address = "127.0.0.1:1"}, &clock).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // The encoder target needs the hidden size, a known profile and a sink.
  CHECK(MakeTarget({.kind = "encoder", .address = "127.0.0.1:1"}, &clock).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(MakeTarget(
            {.kind = "encoder", .address = "127.0.0.1:1", .hidden_size = 128, .profile = "rdma"},
            &clock)
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
  CHECK(MakeTarget(
            {.kind = "encoder", .address = "127.0.0.1:1", .hidden_size = 128, .sink_blocks = 0},
            &clock)
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
  // No encoder there: Connect says UNAVAILABLE, and every request fails so.
  auto enc = MakeTarget({.kind = "encoder",
                         .address = "127.0.0.1:1",
                         .timeout = absl::Seconds(5),
                         .hidden_size = 128},
                        &clock);
  REQUIRE(enc.ok());
  CHECK((*enc)->Connect(absl::Milliseconds(300)).code() == absl::StatusCode::kUnavailable);
  const Summary e = Summarize(RunLoad(**enc, *w, {}, clock), {});
  CHECK(e.errors_by_code.at("UNAVAILABLE") == 5);
  CHECK(e.encode_ms.n == 0);
  CHECK((*enc)->Drained(absl::Seconds(1)).ok());
  CHECK(MakeTarget({.kind = "http", .address = "127.0.0.1"}, &clock).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(MakeTarget({.kind = "http", .address = "127.0.0.1:99999"}, &clock).status().code() ==
        absl::StatusCode::kInvalidArgument);
  spec.repeat_share = 1.5;
  CHECK(BuildWorkload(spec).status().code() == absl::StatusCode::kInvalidArgument);
  spec.repeat_share = 0;
  spec.dataset = "imagenet";
  CHECK(BuildWorkload(spec).status().code() == absl::StatusCode::kInvalidArgument);
  spec.dataset = "demo";
  spec.eval_dir = "/nonexistent";
  CHECK(BuildWorkload(spec).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("synthetic workloads: image count, repeats and text-only") {
  WorkloadSpec spec;
  spec.dataset = "synthetic";
  spec.num_requests = 40;
  spec.images = 2;
  spec.image_width = 16;
  spec.image_height = 16;
  spec.repeat_share = 0.5;
  auto w = BuildWorkload(spec);
  REQUIRE(w.ok());
  REQUIRE(w->items.size() == 40);
  for (const WorkItem& item : w->items) CHECK(item.images.size() == 2);
  // 80 image slots, about half repeats: distinct images well under 80.
  CHECK(w->image_store.size() < 64);
  CHECK(w->image_store.size() > 16);
  spec.repeat_share = 0;
  auto fresh = BuildWorkload(spec);
  REQUIRE(fresh.ok());
  CHECK(fresh->image_store.size() == 80);
  CHECK(GrpcRequest(fresh->items[0]).chat().messages(0).content_size() == 3);
  CHECK(GrpcRequest(fresh->items[0]).sampling().ignore_eos());
}

}  // namespace
}  // namespace mmserve::loadgen
