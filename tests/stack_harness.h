// Helpers for end-to-end tests and benchmarks of a LocalStack: the demo
// evaluation set, one-question gRPC calls, HTTP calls, metric scrapes.
//
//   DemoSet demo = LoadDemoSet(EvalDir());
//   Answer a = AskGrpc(*stub, demo.items[0], {.deadline = absl::Seconds(30)});
//   double used = ScrapeMetric(port, "mmserve_language_embedding_blocks_used");
//
// Thread-safe (AskGrpc may run on many threads with one stub).
#ifndef MMSERVE_TESTS_STACK_HARNESS_H_
#define MMSERVE_TESTS_STACK_HARNESS_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/sanitizer.h"
#include "deploy/launcher/local_stack.h"
#include "proto/inference.grpc.pb.h"
#include "worker/engine.h"

namespace mmserve::testing {

// How many times slower sanitizer builds run the processes: the factor for
// the few bounds that are times (common/sanitizer.h).
using ::mmserve::kSanitizerSlowdown;

// Runfiles root of a test (its binaries, model and eval set), or the
// workspace when run with `bazel run`.
std::string RunfilesRoot();
std::string DemoModelDir();
std::string EvalDir();

struct DemoItem {
  int id = 0;
  std::string image_file;
  std::string question;
  std::string prompt;  // the rendered chat, as the in-process engine takes it
  std::string answer;  // the expected answer
};

struct DemoSet {
  std::vector<DemoItem> items;
  std::map<std::string, std::string> images;  // file -> encoded bytes
};

DemoSet LoadDemoSet(const std::string& eval_dir);
// The demo set from EvalDir(), loaded once.
const DemoSet& Demo();

// The in-process engine's answers to the demo questions (greedy, 8 tokens),
// as //model:demo_eval computes them. InProcess(set, n) covers at least the
// first n questions (all of them when n is larger): each is computed once,
// when a test first needs it, since under sanitizers the engine is several
// times slower and most tests ask a few dozen of the 1500. Index only below
// the n asked for; the object stays valid, its vectors grow on later calls.
struct Reference {
  std::vector<std::string> text;
  std::vector<std::vector<int32_t>> ids;
};
const Reference& InProcess(const DemoSet& set, int n);

// `request`'s greedy tokens on an in-process engine over `model_dir` (64 MiB
// of KV), exactly `max_tokens` of them (the end-of-sequence ignored): the
// reference a model family's stack test compares the services with; the
// engine's error, or Internal when it made another number of tokens.
absl::StatusOr<std::vector<int32_t>> InProcessGreedy(const std::string& model_dir,
                                                     worker::EngineRequest request, int max_tokens);

struct Answer {
  absl::Status status;
  std::string text;
  std::vector<int32_t> token_ids;
  int responses = 0;
  bool cache_hit_reported = false;
  // gRPC trailing metadata x-request-id and retry-after ("" when absent).
  std::string request_id;
  std::string retry_after;
};

struct AskOptions {
  absl::Duration deadline = absl::Seconds(60);
  int max_tokens = 8;
  bool ignore_eos = false;
  // Cancel the call after this many responses (0: never).
  int cancel_after = 0;
  // gRPC metadata "authorization" (e.g. "Bearer <key>"); empty: none.
  std::string authorization;
};

// The demo question as a chat: system default, user [image, question];
// greedy, ids included.
mmserve::v1::GenerateRequest DemoRequest(const DemoSet& set, const DemoItem& item,
                                         const AskOptions& options);
// The demo question alone, as text (no image).
mmserve::v1::GenerateRequest DemoTextRequest(const DemoItem& item, const AskOptions& options);
Answer AskGrpc(mmserve::v1::Inference::Stub& stub, const mmserve::v1::GenerateRequest& request,
               const AskOptions& options);
// POST /v1/chat/completions (non-streamed) on 127.0.0.1:port; the answer's
// text, or the error with its HTTP status in the message.
Answer AskHttp(int port, const DemoSet& set, const DemoItem& item);

// Runs `fn(i)` for i in [0, n) on `threads` threads.
void ParallelFor(int n, int threads, const std::function<void(int)>& fn);

// Streams that a process kill should end: `requests` stream at once; `kill`
// runs once every stream is streaming (options.streaming_tokens) or has
// ended, or after options.wait; then every stream is read to its end.
//
//   KilledStreams run = StreamAndKill(*stub, requests, [&] { kill(pid, SIGKILL); });
//   absl::Status s = run.AllUnavailable(absl::Seconds(2));
//   INFO(s);
//   CHECK(s.ok());
struct StreamKillOptions {
  // A stream is streaming once it has a response and this many token ids.
  int streaming_tokens = 0;
  // The longest the kill waits for the streams to be streaming.
  absl::Duration wait = absl::Seconds(60);
  // Each stream's gRPC deadline.
  absl::Duration deadline = absl::InfiniteDuration();
  // With an HTTP port, the last `http_streams` requests go over the OpenAI
  // API there (streamed chat completions, OpenAiStreamBody) instead of gRPC.
  int http_port = 0;
  int http_streams = 0;
};
struct StreamEnd {
  // As the client saw it: over HTTP, the code from the error event's (or
  // error body's) "code" and its message.
  absl::Status status;
  int tokens = 0;         // token ids; over HTTP, content chunks
  bool streamed = false;  // it was streaming before it ended
  int64_t ended_at_ns = 0;
  bool http = false;
  // gRPC trailing metadata x-request-id / HTTP header X-Request-Id, and
  // retry-after / Retry-After; "" when absent.
  std::string request_id;
  std::string retry_after;
};
struct KilledStreams {
  std::vector<StreamEnd> streams;
  int64_t killed_at_ns = 0;
  // OK when every stream was streaming and then ended with UNAVAILABLE, at
  // most `within` after the kill; else what went wrong, stream by stream.
  absl::Status AllUnavailable(absl::Duration within = absl::InfiniteDuration()) const;
  // OK when every stream's error is one a client may see (CheckPublicError
  // in tests/public_errors.h, against the stack's `internals`) and each
  // UNAVAILABLE asks for a retry after a pause (but over HTTP once
  // streaming: the headers are gone).
  absl::Status AllPublic(const std::vector<std::string>& internals) const;
};
// The OpenAI chat completions body for a chat or raw-text request, streamed:
// its messages (images as data: URLs; a raw prompt as one user message),
// temperature, max_tokens and ignore_eos.
std::string OpenAiStreamBody(const mmserve::v1::GenerateRequest& request);
// One streamed chat completion (OpenAiStreamBody) on 127.0.0.1:port, read
// to its end: its error as the client saw it (the error event or error
// body), content chunks as tokens, X-Request-Id and Retry-After.
StreamEnd AskHttpStream(int port, const mmserve::v1::GenerateRequest& request,
                        absl::Duration deadline = absl::Seconds(60));
KilledStreams StreamAndKill(mmserve::v1::Inference::Stub& stub,
                            const std::vector<mmserve::v1::GenerateRequest>& requests,
                            const std::function<void()>& kill,
                            const StreamKillOptions& options = {});

// A metric's value from a Prometheus endpoint (sum over label sets matching
// `labels`, e.g. "code=\"OK\""); -1 when unreachable or absent.
double ScrapeMetric(int port, const std::string& name, const std::string& labels = "");
// The same from host:port.
double ScrapeMetricAt(const std::string& host, int port, const std::string& name,
                      const std::string& labels = "");

// Every service's blocks and live requests (prefill-0 and decode-0 summed
// when the stack is disaggregated, the live elastic instances when it is
// elastic), once they settle (or the last
// reading after `timeout`): what leak checks assert to be zero.
struct Leaks {
  double language_embedding_blocks_used = -1;
  double language_kv_blocks_used = -1;
  double language_requests_live = -1;
  double encoder_embedding_blocks_used = 0;  // sum over live encoders
  double router_calls_live = -1;
  bool zero() const;
  std::string ToString() const;
};
Leaks WaitForNoLeaks(launcher::LocalStack& stack, absl::Duration timeout);

// Child processes of pid (a TP instance's shard ranks; any of its threads
// may have started them).
std::vector<pid_t> ChildrenOf(pid_t pid);

// Options for a test stack: binaries from the runfiles, logs in the test's
// output directory.
launcher::StackOptions TestStackOptions(int encoders, const std::string& profile);
// Makes `o` an elastic pool of two language instances (router --elastic);
// under a sanitizer their layer waits get 10 s.
void UseElasticPair(launcher::StackOptions& o);

// TestStackOptions(1, "shm") with the router's pre-sizing off, 4-token
// embedding blocks and a one-block default allocation: every embedding past
// 4 tokens arrives in two chunks (the default, then a resume for the rest).
launcher::StackOptions ResumeStackOptions();

}  // namespace mmserve::testing

#endif  // MMSERVE_TESTS_STACK_HARNESS_H_
