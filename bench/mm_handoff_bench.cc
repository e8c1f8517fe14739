// mm_handoff_bench (--mm_handoff=async against blocking): 64 concurrent image requests and
// 64 text requests on a TP=2 language instance (router, encoder, language
// and its shard rank as separate processes), the async descriptor hand-off
// (--mm_handoff=async: embeddings read where UCX wrote them, in a receive
// buffer both ranks map) against the blocking broadcast (--mm_handoff=blocking:
// the loop copies each embedding out and rank 0 copies its rows into every
// step), both stacks up at once and their rounds alternating in one run.
// Per arm: throughput (requests/s), the text requests' TTFT p50/p99, and the
// CPU time the scheduling loop spent moving embeddings
// (mmserve_language_mm_handoff_blocked_seconds_total over the measured
// rounds; requests that failed are counted and left out). Last line JSON: throughput_ratio = async
// / blocking, text_ttft_p99_ratio = blocking / async (both > 1 when async is better; target 1.5 for
// either), blocked_ms_async, blocked_ms_blocking, throughput_ratio_ceiling (the blocking
// arm's wall time over that time less the loop time async saves: the most
// the hand-off can gain on this machine and model).
//
//   bazel run --config=opt //bench:mm_handoff_bench [-- --rounds=8]
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "tests/stack_harness.h"

ABSL_FLAG(int, rounds, 3, "measured rounds per arm (alternating)");
ABSL_FLAG(int, images, 64, "concurrent image requests per round");
ABSL_FLAG(int, texts, 64, "concurrent text requests per round");
ABSL_FLAG(int, max_tokens, 16, "tokens per request");

namespace mmserve::testing {
namespace {

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

struct Timed {
  absl::Status status;
  double ttft_s = -1;
  int tokens = 0;
};

// One streamed Generate call: its status, time to the first token, tokens.
Timed Call(mmserve::v1::Inference::Stub& stub, const mmserve::v1::GenerateRequest& request) {
  Timed t;
  Stopwatch clock;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader = stub.Generate(&ctx, request);
  mmserve::v1::GenerateResponse r;
  while (reader->Read(&r)) {
    if (r.token_ids_size() > 0 && t.ttft_s < 0) t.ttft_s = clock.ElapsedSeconds();
    t.tokens += r.token_ids_size();
  }
  t.status = FromGrpcStatus(reader->Finish());
  return t;
}

mmserve::v1::GenerateRequest TextRequest(int i, int max_tokens) {
  mmserve::v1::GenerateRequest req;
  auto* msg = req.mutable_chat()->add_messages();
  msg->set_role("user");
  msg->add_content()->set_text(absl::StrCat("Describe shape number ", i, " in a few words."));
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(max_tokens);
  req.mutable_sampling()->set_ignore_eos(true);
  req.mutable_stream()->set_include_token_ids(true);
  return req;
}

struct Arm {
  std::string name;
  std::unique_ptr<launcher::LocalStack> stack;
  std::unique_ptr<mmserve::v1::Inference::Stub> stub;
  double seconds = 0;
  int requests = 0;  // that succeeded
  int failed = 0;    // (a loaded machine: gRPC connect timeouts) left out of the figures
  std::vector<double> text_ttft;
  double blocked_s = 0;
};

double Blocked(Arm& arm) {
  return ScrapeMetric(arm.stack->language().metrics_port(),
                      "mmserve_language_mm_handoff_blocked_seconds_total");
}

// One round: every image and text request at once. `offset` picks distinct
// images per round (the encoder's cache would otherwise serve repeats).
void Round(Arm& arm, int offset, bool measure) {
  const DemoSet& set = Demo();
  const int images = absl::GetFlag(FLAGS_images), texts = absl::GetFlag(FLAGS_texts);
  const int max_tokens = absl::GetFlag(FLAGS_max_tokens);
  std::vector<Timed> out(images + texts);
  const double blocked_before = Blocked(arm);
  Stopwatch wall;
  ParallelFor(images + texts, images + texts, [&](int i) {
    if (i < images) {
      AskOptions o;
      o.max_tokens = max_tokens;
      o.ignore_eos = true;
      const DemoItem& item = set.items[(offset + i) % set.items.size()];
      out[i] = Call(*arm.stub, DemoRequest(set, item, o));
    } else {
      out[i] = Call(*arm.stub, TextRequest(i, max_tokens));
    }
  });
  const double seconds = wall.ElapsedSeconds();
  if (!measure) return;
  arm.seconds += seconds;
  for (int i = 0; i < images + texts; ++i) {
    if (!out[i].status.ok()) {
      LOG(WARNING) << arm.name << ": request " << i << ": " << out[i].status;
      ++arm.failed;
      continue;
    }
    ++arm.requests;
    if (i >= images) arm.text_ttft.push_back(out[i].ttft_s);
  }
  arm.blocked_s += Blocked(arm) - blocked_before;
}

// What the blocking variant's two copies of one image's rows (out of the
// receive buffer, into the step) cost at Qwen2-VL-7B dims (hidden 3584, a
// 1024-token image: 14.7 MB), measured here with memcpy: the demo model's
// 9-token, 128-wide embeddings (4.6 KB) cannot show it.
double TwoCopiesMsAt7bDims() {
  const size_t bytes = size_t{3584} * 1024 * sizeof(float);
  std::vector<char> a(bytes, 1), b(bytes), c(bytes);
  std::vector<double> ms;
  for (int i = 0; i < 5; ++i) {
    Stopwatch clock;
    std::memcpy(b.data(), a.data(), bytes);
    std::memcpy(c.data(), b.data(), bytes);
    ms.push_back(clock.ElapsedSeconds() * 1e3);
    a[i] = c[bytes - 1 - i];  // keep the copies
  }
  return Percentile(ms, 0.5);
}

int Main() {
  std::vector<Arm> arms(2);
  arms[0].name = "async";
  arms[1].name = "blocking";
  for (Arm& arm : arms) {
    launcher::StackOptions o = TestStackOptions(1, "shm");
    o.log_dir = "/tmp";
    o.language_args.push_back("--tp=2");
    o.language_args.push_back("--max_num_seqs=128");
    o.language_args.push_back(absl::StrCat("--mm_handoff=", arm.name));
    o.encoder_args.push_back("--cache_mb=0");
    auto stack = launcher::LocalStack::Start(o);
    CHECK_OK(stack.status());
    arm.stack = std::move(*stack);
    arm.stub = mmserve::v1::Inference::NewStub(InternalChannel(arm.stack->router_address()));
  }
  const int images = absl::GetFlag(FLAGS_images);
  for (Arm& arm : arms) Round(arm, 0, /*measure=*/false);  // warm-up
  for (int r = 1; r <= absl::GetFlag(FLAGS_rounds); ++r) {
    // Alternate which arm goes first.
    for (int k = 0; k < 2; ++k) Round(arms[(r + k) % 2], r * images, /*measure=*/true);
  }
  std::printf("%-9s %10s %7s %10s %13s %13s %12s\n", "arm", "requests", "failed", "req/s",
              "text TTFT p50", "text TTFT p99", "blocked ms");
  std::map<std::string, double> tput, p99, blocked_ms;
  for (Arm& arm : arms) {
    tput[arm.name] = arm.requests / arm.seconds;
    p99[arm.name] = Percentile(arm.text_ttft, 0.99);
    blocked_ms[arm.name] = arm.blocked_s * 1e3;
    std::printf("%-9s %10d %7d %10.1f %11.1fms %11.1fms %12.3f\n", arm.name.c_str(), arm.requests,
                arm.failed, tput[arm.name], Percentile(arm.text_ttft, 0.5) * 1e3,
                p99[arm.name] * 1e3, blocked_ms[arm.name]);
  }
  for (Arm& arm : arms) arm.stack->Stop();
  // The ceiling of the async arm's gain here: the blocking arm's wall time
  // without the loop time the async arm saves (the only work that differs
  // between the arms). On the demo model it is a few ms in seconds of
  // prefill and decode, so throughput_ratio cannot reach 1.5 on this machine
  // whatever the hand-off does; the 7B-dims copy figure shows where it can.
  const double saved_s = std::max(0.0, arms[1].blocked_s - arms[0].blocked_s);
  const double ceiling =
      arms[1].seconds > saved_s ? arms[1].seconds / (arms[1].seconds - saved_s) : 0;
  std::printf(
      "ceiling of throughput_ratio on this run: %.4f (%.2f ms of loop time saved in %.2f s)\n",
      ceiling, saved_s * 1e3, arms[1].seconds);
  const double copies_ms = TwoCopiesMsAt7bDims();
  std::printf(
      "blocking variant at Qwen2-VL-7B dims (memcpy x2 of a 1024-token image, 14.7 MB): "
      "%.2f ms of loop time per image\n",
      copies_ms);
  std::printf(
      "{\"bench\": \"mm_handoff_bench\", \"tp\": 2, \"images\": %d, \"texts\": %d, \"rounds\": %d, "
      "\"failed\": %d, "
      "\"throughput_async_rps\": %.2f, \"throughput_blocking_rps\": %.2f, "
      "\"text_ttft_p99_async_ms\": %.2f, \"text_ttft_p99_blocking_ms\": %.2f, "
      "\"throughput_ratio\": %.3f, \"text_ttft_p99_ratio\": %.3f, \"blocked_ms_async\": %.3f, "
      "\"blocked_ms_blocking\": %.3f, \"throughput_ratio_ceiling\": %.4f, "
      "\"blocking_copies_ms_per_image_7b_dims\": %.2f}\n",
      images, absl::GetFlag(FLAGS_texts), absl::GetFlag(FLAGS_rounds),
      arms[0].failed + arms[1].failed, tput["async"], tput["blocking"], p99["async"] * 1e3,
      p99["blocking"] * 1e3, tput["async"] / tput["blocking"], p99["blocking"] / p99["async"],
      blocked_ms["async"], blocked_ms["blocking"], ceiling, copies_ms);
  return 0;
}

}  // namespace
}  // namespace mmserve::testing

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::testing::Main();
}
