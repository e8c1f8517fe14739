// Role prefill's layer-wise hand-off against real decode instances (gRPC,
// UCX over shm): the decode side ends up with the KV of a whole-prompt
// hand-off byte for byte and role both's tokens; a decode process killed
// between two layer groups ends the request UNAVAILABLE with every block
// freed; an abort between two groups ends it at once, sends no CommitKv,
// and frees its blocks when the hand-off thread lets go of them.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "language_service/kv_bytes_moved.h"
#include "language_service/roles_testing.h"

extern char** environ;

namespace mmserve::language {
namespace {

using namespace testing;  // NOLINT: the roles test support

// Prompts longer than one chunk (64 batched tokens): their last chunk's
// forward writes the groups.
const std::vector<std::string> kPrompts = {
    "Layer by layer, the prefill instance writes the keys and values of a long prompt into the "
    "decode instance's cache while it computes the next layers of the same prompt.",
    "A second prompt, also long enough to be split into chunks by the scheduler, so that only "
    "the last chunk's forward hands the layers over one group at a time, in order.",
};

InstanceOptions Layerwise(const std::string& id, absl::Duration delay = absl::ZeroDuration()) {
  return {.id = id, .adjust_role = [delay](RoleOptions& o) {
            o.handoff_layer_group = 1;
            o.handoff_layerwise_min_tokens = 0;
            o.test_kv_handoff_delay = delay;
          }};
}

double LayerGroups(Instance& prefill) {
  return prefill.core->metrics().kv_handoff_layer_groups->value();
}

double SentBytes(Instance& prefill) {
  return KvBytesMoved(prefill.registry, "handoff").sent->value();
}

bool AwaitSent(Instance& prefill) {
  const Deadline d = Deadline::After(absl::Seconds(20));
  while (SentBytes(prefill) == 0 && !d.Expired()) absl::SleepFor(absl::Milliseconds(1));
  return SentBytes(prefill) > 0;
}

// Every float of the decode instance's KV cache.
std::vector<float> CacheFloats(Instance& decode) {
  model::KvCache& kv = decode.core->engine().kv_cache();
  const int64_t n = 2 * kv.shape().num_layers * kv.shape().LayerPlaneFloats();
  return std::vector<float>(kv.Key(0), kv.Key(0) + n);
}

// A Decode stream opened as the router opens it, held until the request
// is registered there (its first, empty batch).
struct DecodeStream {
  DecodeStream(v1::Language::Stub& stub, const std::string& id, uint32_t max_tokens) {
    v1::DecodeRequest d;
    d.set_request_id(id);
    *d.mutable_sampling() = Greedy(max_tokens);
    reader = stub.Decode(&ctx, d);
    v1::TokenBatch registered;
    ok = reader->Read(&registered);
  }
  Output Drain() {
    Output out;
    mmserve::language::testing::Drain(reader, &out);
    return out;
  }
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::TokenBatch>> reader;
  bool ok = false;
};

// A Prefill stream naming the decode instance at `decode_address`, drained
// on a thread of its own.
struct PrefillStream {
  PrefillStream(Instance& prefill, const std::string& decode_address, const std::string& id) {
    v1::PrefillRequest r = Request(id, kPrompts[0], Greedy(8));
    r.mutable_decode()->set_instance_id("decode");
    r.mutable_decode()->set_address(decode_address);
    reader = prefill.stub->Prefill(&ctx, r);
    drainer = std::thread([this] { Drain(reader, &out); });
  }
  ~PrefillStream() {
    if (drainer.joinable()) drainer.join();
  }
  Output Join() {
    drainer.join();
    return out;
  }
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::TokenBatch>> reader;
  Output out;
  std::thread drainer;
};

TEST_CASE("a layer-wise hand-off gives the decode instance a whole one's KV, byte for byte",
          "[roles][layerwise]") {
  Instance both(LanguageRole::kBoth);
  Instance layered(LanguageRole::kPrefill, absl::Seconds(10), 1, Layerwise("prefill-l"));
  Instance whole(
      LanguageRole::kPrefill, absl::Seconds(10), 1,
      {.id = "prefill-w", .adjust_role = [](RoleOptions& o) { o.handoff_layer_group = 0; }});
  Instance decode_l(LanguageRole::kDecode, absl::Seconds(10), 1, {.id = "decode-l"});
  Instance decode_w(LanguageRole::kDecode, absl::Seconds(10), 1, {.id = "decode-w"});
  // The same requests in the same order: the decode instances allocate the
  // same blocks (the second round hits their prefix caches).
  SplitEqualsBoth(both, layered, decode_l, kPrompts, {.id_prefix = "lw"});
  SplitEqualsBoth(both, whole, decode_w, kPrompts, {.id_prefix = "lw"});
  REQUIRE(decode_l.Idle());
  REQUIRE(decode_w.Idle());
  CHECK(layered.Idle());
  CHECK(whole.Idle());
  // Every hand-off went layer by layer (2 layers, 1 rank: 2 groups each) on
  // one side, whole on the other, with the same bytes.
  CHECK(LayerGroups(layered) == 2 * 8);
  CHECK(LayerGroups(whole) == 0);
  CHECK(SentBytes(layered) == SentBytes(whole));
  const std::vector<float> got = CacheFloats(decode_l), want = CacheFloats(decode_w);
  REQUIRE(got.size() == want.size());
  CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
}

// A decode instance in a process of its own (decode_role_testing_main).
struct DecodeProcess {
  DecodeProcess() {
    int out[2];
    REQUIRE(pipe(out) == 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    std::string binary = "language_service/decode_role_testing_main";
    std::string model = kModel;
    char* argv[] = {binary.data(), model.data(), nullptr};
    REQUIRE(posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    std::string line;
    char c;
    while (read(out[0], &c, 1) == 1 && c != '\n') line += c;
    close(out[0]);
    REQUIRE(!line.empty());
    address = "127.0.0.1:" + line;
    stub = v1::Language::NewStub(InternalChannel(address));
  }
  ~DecodeProcess() { Kill(); }
  void Kill() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
  pid_t pid = -1;
  std::string address;
  std::unique_ptr<v1::Language::Stub> stub;
};

TEST_CASE("a decode process killed between layer groups: UNAVAILABLE, every block freed",
          "[roles][layerwise]") {
  Instance prefill(LanguageRole::kPrefill, absl::Seconds(10), 1,
                   Layerwise("prefill-k", absl::Seconds(1)));
  DecodeProcess decode;
  DecodeStream dstream(*decode.stub, "killed-0", 8);
  REQUIRE(dstream.ok);
  PrefillStream pstream(prefill, decode.address, "killed-0");
  REQUIRE(AwaitSent(prefill));  // the first group is written; the second waits
  decode.Kill();
  const Output out = pstream.Join();
  CHECK(out.status.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(out.tokens.empty());  // the first token goes out only after CommitKv
  CHECK_FALSE(out.handed_off);
  CHECK(prefill.Idle());
  dstream.ctx.TryCancel();
  dstream.Drain();
}

TEST_CASE("an abort between layer groups ends the request at once and frees its blocks",
          "[roles][layerwise]") {
  Instance prefill(LanguageRole::kPrefill, absl::Seconds(10), 1,
                   Layerwise("prefill-a", absl::Seconds(2)));
  Instance decode(LanguageRole::kDecode, absl::Seconds(10), 1, {.id = "decode-a"});
  DecodeStream dstream(*decode.stub, "aborted-0", 8);
  REQUIRE(dstream.ok);
  PrefillStream pstream(prefill, decode.address, "aborted-0");
  REQUIRE(AwaitSent(prefill));
  v1::AbortRequest abort;
  abort.set_request_id("aborted-0");
  abort.set_reason("the client left");
  v1::AbortResponse aborted;
  grpc::ClientContext actx;
  REQUIRE(prefill.stub->Abort(&actx, abort, &aborted).ok());
  const Output out = pstream.Join();  // while the hand-off thread still waits
  CHECK(out.status.error_code() == grpc::StatusCode::CANCELLED);
  CHECK(out.tokens.empty());
  CHECK(prefill.Idle());
  // No CommitKv went: the router's cancel of the decode stream frees the
  // reservation there.
  dstream.ctx.TryCancel();
  const Output decoded = dstream.Drain();
  CHECK(decoded.tokens.empty());
  CHECK(decode.Idle());
}

}  // namespace
}  // namespace mmserve::language
