// The load generator against a real stack (router, encoder, language as
// separate processes, started with the launcher): 200 demo requests at
// 20 req/s end to end over gRPC and over HTTP, and 200 text-only requests
// straight at the language instance, each with zero errors and zero leaked
// blocks afterwards (from metrics); p99 latencies printed, never asserted.
// Also the rejection paths: errors are counted by their gRPC code.
#include <catch2/catch.hpp>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "bench/loadgen/runner.h"
#include "bench/loadgen/stats.h"
#include "bench/loadgen/target.h"
#include "bench/loadgen/workload.h"
#include "tests/stack_harness.h"

namespace mmserve::loadgen {
namespace {

Summary RunAndReport(const std::string& name, const TargetOptions& to, const WorkloadSpec& spec,
                     const RunOptions& ro) {
  auto workload = BuildWorkload(spec);
  REQUIRE(workload.ok());
  Stopwatch clock;
  auto target = MakeTarget(to, &clock);
  REQUIRE(target.ok());
  REQUIRE((*target)->Connect(absl::Seconds(10)).ok());
  std::vector<Record> records = RunLoad(**target, *workload, ro, clock);
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

  CHECK(MakeTarget({.kind = "encoder", .address = "127.0.0.1:1"}, &clock).status().code() ==
        absl::StatusCode::kInvalidArgument);
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
