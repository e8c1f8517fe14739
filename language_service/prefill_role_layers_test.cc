// Role prefill's layer-wise hand-off against real decode instances (gRPC,
// UCX over shm): the decode side's cache ends up as after a whole-prompt
// hand-off, byte for byte, and the tokens are role both's; a decode process killed
// between two layer groups ends the request UNAVAILABLE with every block
// freed; an abort between two groups ends it at once, sends no CommitKv,
// and frees its blocks when the hand-off thread lets go of them. A
// tensor-parallel decode instance gets each rank's heads group by group.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "language_service/kv_bytes_moved.h"
#include "language_service/roles_testing.h"
#include "transfer/kv_handoff.h"
#include "transfer/ucx_context.h"

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

// An unlabelled metric's value, from the instance's scrape.
double Scraped(Instance& prefill, const std::string& metric) {
  const std::string name = "\n" + metric + " ";
  const std::string text = prefill.registry.Render();
  const size_t at = text.find(name);
  REQUIRE(at != std::string::npos);
  return std::stod(text.substr(at + name.size()));
}

// mmserve_language_kv_handoff_layer_groups_total.
double LayerGroups(Instance& prefill) {
  return Scraped(prefill, "mmserve_language_kv_handoff_layer_groups_total");
}

double SentBytes(Instance& prefill) {
  return KvBytesMoved(prefill.registry, "handoff").sent->value();
}

bool AwaitSent(Instance& prefill) {
  const Deadline d = Deadline::After(absl::Seconds(20));
  while (SentBytes(prefill) == 0 && !d.Expired()) absl::SleepFor(absl::Milliseconds(1));
  return SentBytes(prefill) > 0;
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

// The hand-off side of a decode instance alone, to read its KV back: its
// cache in a KvHandoffReceiver (shm: the prefill side maps and copies into
// it, as into a decode instance's); AllocateKv answers the first blocks of
// it, CommitKv checks their CRC32C against the commit's, as role decode
// does.
class RecordingDecode final : public v1::Language::Service {
 public:
  RecordingDecode(const model::KvCacheShape& shape, const std::string& name) {
    auto c = transfer::UcxContext::Create(transfer::TransportProfile::kShm);
    REQUIRE(c.ok());
    context_ = std::move(*c);
    auto rx = transfer::KvHandoffReceiver::CreateWithCache(*context_, shape, {.name = name});
    REQUIRE(rx.ok());
    receiver_ = std::move(*rx);
    auto s = StartGrpcServer("127.0.0.1:0", {this});
    REQUIRE(s.ok());
    server_ = std::move(*s);
    server_->SetServing(true);
    address = "127.0.0.1:" + std::to_string(server_->port());
  }
  ~RecordingDecode() override { server_->Shutdown(absl::Seconds(1)); }

  grpc::Status AllocateKv(grpc::ServerContext*, const v1::KvAllocateRequest* request,
                          v1::KvAllocation* a) override {
    if (on_allocate) on_allocate();
    const transfer::KvHandoffTarget& t = receiver_->target();
    absl::MutexLock lock(&mu_);
    blocks_.clear();
    for (int64_t b = 0; b * t.shape.block_size < request->num_tokens(); ++b) {
      blocks_.push_back(static_cast<int32_t>(b));
    }
    a->set_request_id(request->request_id());
    a->set_num_tokens(request->num_tokens());
    v1::KvRankTarget* rank = a->add_ranks();
    rank->mutable_peer()->set_worker_address(t.worker_address);
    rank->mutable_peer()->set_transport_profile("shm");
    rank->mutable_peer()->set_host(transfer::HostIdentity());
    v1::KvLayout* l = rank->mutable_layout();
    l->set_num_layers(static_cast<uint32_t>(t.shape.num_layers));
    l->set_num_kv_heads(static_cast<uint32_t>(t.shape.num_kv_heads));
    l->set_head_dim(static_cast<uint32_t>(t.shape.head_dim));
    l->set_block_size(static_cast<uint32_t>(t.shape.block_size));
    l->set_num_blocks(static_cast<uint32_t>(t.shape.num_blocks));
    l->set_dtype(v1::TENSOR_DTYPE_FLOAT32);
    l->set_tp_rank(0);
    l->set_tp_size(1);
    rank->mutable_kv_region()->set_base_address(t.base_address);
    rank->mutable_kv_region()->set_length(t.shape.TotalBytes());
    rank->mutable_kv_region()->set_rkey(t.rkey);
    for (int32_t b : blocks_) rank->add_block_ids(static_cast<uint32_t>(b));
    return grpc::Status::OK;
  }
  grpc::Status CommitKv(grpc::ServerContext*, const v1::KvCommit* commit,
                        v1::KvCommitAck* ack) override {
    REQUIRE(receiver_->AwaitLandedWrites().ok());
    absl::MutexLock lock(&mu_);
    crc = transfer::KvBlocksCrc(*receiver_->owned_cache(), blocks_);
    ack->set_accepted(commit->rank_crc32c_size() == 1 && commit->rank_crc32c(0) == crc);
    return grpc::Status::OK;
  }

  // Every float of the cache.
  std::vector<float> Floats() {
    REQUIRE(receiver_->AwaitLandedWrites().ok());
    const model::KvCache& kv = *receiver_->owned_cache();
    const int64_t n = 2 * kv.shape().num_layers * kv.shape().LayerPlaneFloats();
    return std::vector<float>(kv.Key(0), kv.Key(0) + n);
  }

  std::string address;
  uint32_t crc = 0;                   // of the last commit
  std::function<void()> on_allocate;  // set before the first request

 private:
  std::unique_ptr<transfer::UcxContext> context_;
  std::unique_ptr<transfer::KvHandoffReceiver> receiver_;
  std::unique_ptr<GrpcServer> server_;
  absl::Mutex mu_;
  std::vector<int32_t> blocks_ ABSL_GUARDED_BY(mu_);
};

Output PrefillInto(Instance& prefill, const std::string& decode_address, const std::string& id,
                   const std::string& text) {
  v1::PrefillRequest r = Request(id, text, Greedy(8));
  r.mutable_decode()->set_instance_id("decode");
  r.mutable_decode()->set_address(decode_address);
  return RunBoth(prefill, r);  // the prefill stream alone
}

TEST_CASE("a layer-wise hand-off writes the decode cache byte for byte as a whole one",
          "[roles][layerwise]") {
  Instance layered(LanguageRole::kPrefill, absl::Seconds(10), 1, Layerwise("prefill-l"));
  Instance whole(
      LanguageRole::kPrefill, absl::Seconds(10), 1,
      {.id = "prefill-w", .adjust_role = [](RoleOptions& o) { o.handoff_layer_group = 0; }});
  const model::TextConfig& cfg = layered.core->config().text;
  const model::KvCacheShape shape{cfg.num_hidden_layers, 64, 4, cfg.num_key_value_heads,
                                  cfg.head_dim()};
  RecordingDecode to_layered(shape, "rec-l"), to_whole(shape, "rec-w");
  for (const std::string& text : kPrompts) {
    INFO(text);
    const Output a = PrefillInto(layered, to_layered.address, "bytes-l", text);
    const Output b = PrefillInto(whole, to_whole.address, "bytes-w", text);
    INFO(a.status.error_message() << " / " << b.status.error_message());
    REQUIRE(a.status.ok());
    REQUIRE(b.status.ok());
    CHECK(a.handed_off);
    CHECK(a.tokens == b.tokens);
    CHECK(to_layered.crc == to_whole.crc);
    const std::vector<float> got = to_layered.Floats(), want = to_whole.Floats();
    REQUIRE(got.size() == want.size());
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
  }
  // 2 layers, 1 rank: 2 groups a prompt, and the same bytes either way.
  CHECK(LayerGroups(layered) == 2 * kPrompts.size());
  CHECK(LayerGroups(whole) == 0);
  CHECK(SentBytes(layered) == SentBytes(whole));
  CHECK(layered.Idle());
  CHECK(whole.Idle());
}

// Engine steps the instance has finished (mmserve_language_step_seconds).
double Steps(Instance& prefill) { return Scraped(prefill, "mmserve_language_step_seconds_count"); }

TEST_CASE(
    "a layer-wise prompt asks for its decode blocks once its last chunk computes, not when "
    "it is queued",
    "[roles][layerwise]") {
  Instance prefill(LanguageRole::kPrefill, absl::Seconds(10), 1, Layerwise("prefill-a"));
  const model::TextConfig& cfg = prefill.core->config().text;
  RecordingDecode decode({cfg.num_hidden_layers, 64, 4, cfg.num_key_value_heads, cfg.head_dim()},
                         "rec-a");
  // Two prompts' text: prefilled in several chunks of 64 tokens; the
  // decode reservation starts during the last one, after the earlier
  // chunks' steps.
  std::atomic<double> steps_at_allocate{-1};
  decode.on_allocate = [&] { steps_at_allocate = Steps(prefill); };
  const double before = Steps(prefill);
  const Output out =
      PrefillInto(prefill, decode.address, "alloc-0", kPrompts[0] + " " + kPrompts[1]);
  REQUIRE(out.status.ok());
  CHECK(out.handed_off);
  const double steps = Steps(prefill) - before;
  INFO("steps before " << before << ", at AllocateKv " << steps_at_allocate.load() << ", in all "
                       << steps);
  REQUIRE(steps >= 2);  // chunked, or the check below says nothing
  CHECK(steps_at_allocate.load() >= before + steps - 1);
  CHECK(LayerGroups(prefill) > 0);
  CHECK(prefill.Idle());
}

TEST_CASE("a first token that ends the request stops its layer groups; nothing is committed",
          "[roles][layerwise]") {
  Instance both(LanguageRole::kBoth);
  Instance prefill(LanguageRole::kPrefill, absl::Seconds(10), 1, Layerwise("prefill-s"));
  const Output want = RunBoth(both, Request("stop-0", kPrompts[0], Greedy(8)));
  REQUIRE(want.status.ok());
  REQUIRE(!want.tokens.empty());
  const model::TextConfig& cfg = prefill.core->config().text;
  RecordingDecode decode({cfg.num_hidden_layers, 64, 4, cfg.num_key_value_heads, cfg.head_dim()},
                         "rec-s");
  mmserve::v1::SamplingParams s = Greedy(8);
  s.add_stop_token_ids(want.tokens[0]);  // the first token ends it here
  v1::PrefillRequest r = Request("stop-0", kPrompts[0], s);
  r.mutable_decode()->set_instance_id("decode");
  r.mutable_decode()->set_address(decode.address);
  const Output out = RunBoth(prefill, r);
  REQUIRE(out.status.ok());
  CHECK_FALSE(out.handed_off);
  CHECK(out.tokens == std::vector<uint32_t>{want.tokens[0]});
  CHECK(out.finish == mmserve::v1::FINISH_REASON_STOP);
  CHECK(decode.crc == 0);  // no CommitKv
  CHECK(prefill.Idle());
}

TEST_CASE("prefill + decode with layer-wise hand-offs give role both's tokens",
          "[roles][layerwise]") {
  Instance both(LanguageRole::kBoth);
  Instance prefill(LanguageRole::kPrefill, absl::Seconds(10), 1, Layerwise("prefill-t"));
  Instance decode(LanguageRole::kDecode, absl::Seconds(10), 1, {.id = "decode-t"});
  SplitEqualsBoth(both, prefill, decode, kPrompts, {.id_prefix = "lw"});
  // Every request: 2 layer groups (greedy and seeded, two rounds).
  CHECK(LayerGroups(prefill) == 2 * 2 * 2 * kPrompts.size());
  CHECK(prefill.Idle());
  CHECK(decode.Idle());
}

TEST_CASE("layer-wise hand-offs to a tensor-parallel decode instance: each rank its heads",
          "[roles][layerwise][tp]") {
  Instance both(LanguageRole::kBoth);
  Instance prefill(LanguageRole::kPrefill, absl::Seconds(10), 1, Layerwise("prefill-tp"));
  Instance decode(LanguageRole::kDecode, absl::Seconds(10), 2, {.id = "decode-tp"});
  SplitEqualsBoth(both, prefill, decode, kPrompts, {.id_prefix = "lwtp"});
  // Every request: 2 layer groups to each of the 2 ranks.
  CHECK(LayerGroups(prefill) == 2 * 2 * 2 * 2 * kPrompts.size());
  CHECK(prefill.Idle());
  CHECK(decode.Idle());
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
