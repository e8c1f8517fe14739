// The protocol between separate processes on loopback (this test and the
// transfer_peer helper), on both profiles, including peers killed with
// SIGKILL before, during and after a transfer.
#include <dirent.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <future>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "transfer/payload_testing.h"
#include "transfer/peer_process.h"
#include "transfer/transfer_engine.h"

namespace mmserve::transfer {
namespace {

constexpr uint32_t kHidden = 64;
// Short, so that receives failed by a dead shm sender free their blocks soon.
constexpr absl::Duration kQuarantine = absl::Milliseconds(300);

struct Session {
  std::unique_ptr<TransferEngine> engine;  // this process
  std::unique_ptr<PeerProcess> child;
};

// Starts this side as `id` and the helper with `child_args`, and connects both.
// A profile and the data path both processes use.
struct Setup {
  TransportProfile profile;
  DataPath path;
};

Session Start(const Setup& setup, const std::string& id, uint32_t num_blocks,
              uint32_t default_blocks, std::vector<std::string> child_args,
              absl::Duration quarantine_limit = kQuarantine) {
  Session s;
  const TransportProfile profile = setup.profile;
  auto engine = TransferEngine::Create(
      {.instance_id = id,
       .profile = profile,
       .layout = {.block_size = 16, .num_blocks = num_blocks, .hidden_size = kHidden},
       .default_num_blocks = default_blocks,
       .data_path = setup.path,
       .quarantine_limit = quarantine_limit});
  REQUIRE(engine.ok());
  s.engine = std::move(*engine);
  child_args.push_back(std::string("--profile=") + TransportProfileName(profile));
  child_args.push_back("--hidden=" + std::to_string(kHidden));
  child_args.push_back(std::string("--data_path=") + DataPathName(setup.path));
  auto child = PeerProcess::Spawn(PeerBinaryPath(), child_args);
  REQUIRE(child.ok());
  s.child = std::move(*child);
  Deadline d = Deadline::After(absl::Seconds(20));
  std::optional<std::string> info = s.child->ReadLine(d);
  REQUIRE(info.has_value());
  REQUIRE(info->rfind("INFO ", 0) == 0);
  v1::ConnectRequest peer;
  REQUIRE(peer.ParseFromString(FromHex(info->substr(5))));
  REQUIRE(s.engine->Connect(peer).ok());
  REQUIRE(s.child->WriteLine("PEER " + ToHex(s.engine->local_info().SerializeAsString())));
  REQUIRE(s.child->ReadLine(d) == std::optional<std::string>("READY"));
  return s;
}

std::vector<std::string> Fields(const std::optional<std::string>& line) {
  REQUIRE(line.has_value());
  return absl::StrSplit(*line, ' ');
}

absl::StatusOr<ReceivedMedia> ReceiveNow(TransferEngine& engine, ReceiveRequest request) {
  auto done = std::make_shared<std::promise<absl::StatusOr<ReceivedMedia>>>();
  engine.Receive(std::move(request), [done](absl::StatusOr<ReceivedMedia> image) {
    done->set_value(std::move(image));
  });
  auto f = done->get_future();
  REQUIRE(f.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  return f.get();
}

// Fault-test timings go to the test log.
void Report(TransportProfile profile, const char* what, const absl::Status& status,
            absl::Duration took) {
  std::cerr << "[fault] " << TransportProfileName(profile) << ": " << what << " -> "
            << absl::StatusCodeToString(status.code()) << " in " << took << "\n";
}

// A failed put-path receive may keep its blocks quarantined until the sender
// acknowledges the cancel, or for the engine's quarantine limit at most.
bool BlocksFreedWithin(TransferEngine& engine, absl::Duration bound) {
  Deadline d = Deadline::After(bound);
  while (engine.allocator().used_blocks() != 0 && !d.Expired())
    absl::SleepFor(absl::Milliseconds(1));
  return engine.allocator().used_blocks() == 0;
}

// Both profiles with their default data paths, and shm with puts too.
Setup AnySetup() {
  return GENERATE(values<Setup>({{TransportProfile::kShm, DataPath::kGet},
                                 {TransportProfile::kShm, DataPath::kPut},
                                 {TransportProfile::kTcp, DataPath::kTag}}));
}

// How fast a survivor must notice a dead peer: tcp reports it (error mode
// PEER); shm relies on the transfer's own deadline.
absl::Duration Bound(TransportProfile profile, absl::Duration timeout) {
  return profile == TransportProfile::kTcp ? absl::Seconds(2) : timeout + absl::Seconds(1);
}

TEST_CASE(
    "separate processes move exact, default-smaller and default-larger images byte for byte") {
  const Setup setup = AnySetup();
  const TransportProfile profile = setup.profile;
  INFO("profile " << TransportProfileName(profile) << " data path " << DataPathName(setup.path));
  // Receiver here: 5 blocks of 16 tokens, default 1 block. The sender child
  // publishes 70 (received exactly), 40 (one resume), 200 (16 + 80 + 80 + 24:
  // several resumes, each capped by the small pool) and 10 tokens (default
  // larger than the image).
  Session s = Start(setup, "lang", 5, 1, {"--role=sender", "--tokens=70,40,200,10", "--seed=3"});
  const uint32_t lengths[] = {70, 40, 200, 10};
  const uint32_t chunks[] = {1, 2, 4, 1};
  for (int k = 0; k < 4; ++k) {
    INFO("image " << k);
    PayloadSpec spec{.seed = 3u + k, .total_tokens = lengths[k]};
    absl::StatusOr<ReceivedMedia> image =
        ReceiveNow(*s.engine, {.request_id = "req-" + std::to_string(k),
                               .sender = "sender",
                               .known_tokens = k == 0 ? lengths[k] : 0});
    REQUIRE(image.ok());
    CHECK(image->num_chunks() == chunks[k]);
    for (int sec = 0; sec < kNumSections; ++sec) {
      CHECK(image->Section(sec) == ExpectedSection(s.engine->buffer().layout(), spec, sec));
    }
  }
  CHECK(s.engine->allocator().used_blocks() == 0);
  for (int k = 0; k < 4; ++k) {
    std::vector<std::string> f = Fields(s.child->ReadLine(Deadline::After(absl::Seconds(10))));
    CHECK(f[0] == "SENT");
    CHECK(f[2] == "0");
  }
  s.child->WriteLine("EXIT");
  CHECK(s.child->Wait(Deadline::After(absl::Seconds(10))) == 0);
}

TEST_CASE("a receiver process gets images from this process byte for byte") {
  const Setup setup = AnySetup();
  const TransportProfile profile = setup.profile;
  INFO("profile " << TransportProfileName(profile) << " data path " << DataPathName(setup.path));
  Session s = Start(setup, "enc", 64, 1,
                    {"--role=receiver", "--tokens=40,200", "--num_blocks=5", "--seed=11"});
  const uint32_t lengths[] = {40, 200};
  std::vector<std::future<absl::Status>> sent;
  for (int k = 0; k < 2; ++k) {
    auto blocks = s.engine->allocator().Alloc(lengths[k], "req-" + std::to_string(k));
    REQUIRE(blocks.ok());
    WriteImage(s.engine->buffer(), *blocks, {.seed = 11u + k, .total_tokens = lengths[k]});
    auto done = std::make_shared<std::promise<absl::Status>>();
    sent.push_back(done->get_future());
    s.engine->Publish({.request_id = "req-" + std::to_string(k), .blocks = *blocks},
                      [done](absl::Status st) { done->set_value(st); });
  }
  for (int k = 0; k < 2; ++k) {
    std::vector<std::string> f = Fields(s.child->ReadLine(Deadline::After(absl::Seconds(20))));
    REQUIRE(f.size() == 5);
    CHECK(f[0] == "RECV");
    CHECK(f[2] == "0");
    CHECK(f[4] == "ok");
    CHECK(sent[k].get().ok());
  }
  CHECK(Fields(s.child->ReadLine(Deadline::After(absl::Seconds(5))))[1] == "0");  // BLOCKS 0
  CHECK(s.engine->allocator().used_blocks() == 0);
}

TEST_CASE("a sender killed before the transfer gives the receiver an error in time") {
  const Setup setup = AnySetup();
  const TransportProfile profile = setup.profile;
  INFO("profile " << TransportProfileName(profile) << " data path " << DataPathName(setup.path));
  Session s = Start(setup, "lang", 16, 1, {"--role=sender", "--tokens=100", "--window=0"});
  s.child->Kill();
  const absl::Duration timeout = absl::Milliseconds(500);
  Stopwatch watch;
  absl::StatusOr<ReceivedMedia> image =
      ReceiveNow(*s.engine, {.request_id = "req-0", .sender = "sender", .timeout = timeout});
  absl::Duration took = absl::Nanoseconds(watch.ElapsedNanos());
  INFO(image.status() << " after " << took);
  Report(profile, "sender killed before", image.status(), took);
  CHECK((absl::IsUnavailable(image.status()) || absl::IsDeadlineExceeded(image.status())));
  CHECK(took < Bound(profile, timeout));
  CHECK(BlocksFreedWithin(*s.engine, kQuarantine + absl::Seconds(1)));
}

TEST_CASE("a sender killed mid-transfer gives the receiver an error in time and frees its blocks") {
  const Setup setup = AnySetup();
  const TransportProfile profile = setup.profile;
  INFO("profile " << TransportProfileName(profile) << " data path " << DataPathName(setup.path));
  Session s = Start(setup, "lang", 16, 1, {"--role=sender", "--tokens=200"});
  const absl::Duration timeout = absl::Milliseconds(800);
  PeerProcess* child = s.child.get();
  auto killed_at = std::make_shared<std::atomic<int64_t>>(0);
  absl::StatusOr<ReceivedMedia> image = ReceiveNow(
      *s.engine, {.request_id = "req-0",
                  .sender = "sender",
                  .timeout = timeout,
                  .on_chunk = [child, killed_at](const v1::EmbeddingChunkNotice& notice) {
                    if (notice.offset_tokens() == 0) {  // first of several chunks
                      child->Kill();
                      killed_at->store(MonotonicNanos());
                    }
                  }});
  absl::Duration took = absl::Nanoseconds(MonotonicNanos() - killed_at->load());
  INFO(image.status() << " " << took << " after the kill");
  Report(profile, "sender killed during", image.status(), took);
  REQUIRE(killed_at->load() != 0);
  CHECK((absl::IsUnavailable(image.status()) || absl::IsDeadlineExceeded(image.status())));
  CHECK(took < Bound(profile, timeout));
  CHECK(BlocksFreedWithin(*s.engine, kQuarantine + absl::Seconds(1)));
}

TEST_CASE("a sender killed after a transfer leaves the image intact and later receives fail fast") {
  const Setup setup = AnySetup();
  const TransportProfile profile = setup.profile;
  INFO("profile " << TransportProfileName(profile) << " data path " << DataPathName(setup.path));
  Session s = Start(setup, "lang", 16, 4, {"--role=sender", "--tokens=40", "--seed=5"});
  absl::StatusOr<ReceivedMedia> image =
      ReceiveNow(*s.engine, {.request_id = "req-0", .sender = "sender"});
  REQUIRE(image.ok());
  s.child->Kill();
  PayloadSpec spec{.seed = 5, .total_tokens = 40};
  CHECK(image->Section(kEmbedding) ==
        ExpectedSection(s.engine->buffer().layout(), spec, kEmbedding));
  image->Release();
  const absl::Duration timeout = absl::Milliseconds(500);
  Stopwatch watch;
  absl::StatusOr<ReceivedMedia> next =
      ReceiveNow(*s.engine, {.request_id = "req-1", .sender = "sender", .timeout = timeout});
  absl::Duration took = absl::Nanoseconds(watch.ElapsedNanos());
  INFO(next.status() << " after " << took);
  Report(profile, "sender killed after", next.status(), took);
  CHECK((absl::IsUnavailable(next.status()) || absl::IsDeadlineExceeded(next.status())));
  CHECK(took < Bound(profile, timeout));
  CHECK(BlocksFreedWithin(*s.engine, kQuarantine + absl::Seconds(1)));
}

TEST_CASE("a receiver killed mid-transfer lets the sender free its blocks in time") {
  const Setup setup = AnySetup();
  const TransportProfile profile = setup.profile;
  INFO("profile " << TransportProfileName(profile) << " data path " << DataPathName(setup.path));
  const absl::Duration timeout = absl::Milliseconds(800);
  Session s = Start(setup, "enc", 64, 1,
                    {"--role=receiver", "--tokens=200", "--stall_after_chunk", "--timeout_ms=800"});
  auto blocks = s.engine->allocator().Alloc(200, "req-0");
  REQUIRE(blocks.ok());
  WriteImage(s.engine->buffer(), *blocks, {.seed = 1, .total_tokens = 200});
  auto done = std::make_shared<std::promise<absl::Status>>();
  auto sent = done->get_future();
  s.engine->Publish({.request_id = "req-0", .blocks = *blocks, .keep_for = absl::Seconds(30)},
                    [done](absl::Status st) { done->set_value(st); });
  CHECK(Fields(s.child->ReadLine(Deadline::After(absl::Seconds(10))))[0] == "CHUNK");
  s.child->Kill();
  Stopwatch watch;
  REQUIRE(sent.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  absl::Status status = sent.get();
  absl::Duration took = absl::Nanoseconds(watch.ElapsedNanos());
  INFO(status << " " << took << " after the kill");
  Report(profile, "receiver killed during", status, took);
  CHECK((absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)));
  CHECK(took < Bound(profile, timeout));
  CHECK(s.engine->allocator().used_blocks() == 0);
}

// SIGSTOPs `pid` and waits until every thread of it is stopped: kill()
// returns before a thread running on another core has stopped, and a sender
// that still sees our init in that window would serve it.
void StopProcess(pid_t pid) {
  REQUIRE(kill(pid, SIGSTOP) == 0);
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  Deadline d = Deadline::After(absl::Seconds(5));
  for (;;) {
    bool all_stopped = true;
    DIR* dir = opendir(tasks.c_str());
    REQUIRE(dir != nullptr);
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream stat(tasks + "/" + e->d_name + "/stat");
      std::string line;
      std::getline(stat, line);
      // The state follows the parenthesised command name.
      const size_t close = line.rfind(')');
      const char state = close + 2 < line.size() ? line[close + 2] : '?';
      all_stopped = all_stopped && (state == 'T' || state == 't');
    }
    closedir(dir);
    if (all_stopped) return;
    REQUIRE(!d.Expired());
    absl::SleepFor(absl::Microseconds(100));
  }
}

// Once the child sender (started with --say_published) has published req-0
// (40 tokens), SIGSTOPs it and runs a 200 ms receive of it, which times out;
// the child stays stopped. Stopping it before it published would let the
// cancel reach it before the image, which it would then keep for its full
// keep_for.
absl::Status ReceiveFromStoppedSender(Session& s) {
  std::vector<std::string> f = Fields(s.child->ReadLine(Deadline::After(absl::Seconds(5))));
  REQUIRE(f.size() == 2);
  REQUIRE(f[0] == "PUBLISHED");
  StopProcess(s.child->pid());
  return ReceiveNow(*s.engine, {.request_id = "req-0",
                                .sender = "sender",
                                .known_tokens = 40,
                                .timeout = absl::Milliseconds(200)})
      .status();
}

TEST_CASE("a timed-out put-path receive quarantines its blocks while a stopped sender may write") {
  // shm: the sender puts into this process's blocks and cannot be revoked.
  // The child has published the image; SIGSTOP keeps it from seeing our init
  // until after this receive timed out. Freed blocks would then be written by
  // its late put after being handed to another transfer.
  const bool sender_resumes = GENERATE(true, false);
  INFO("sender resumes: " << sender_resumes);
  const absl::Duration limit = sender_resumes ? absl::Seconds(5) : absl::Milliseconds(300);
  Session s = Start({TransportProfile::kShm, DataPath::kPut}, "lang", 16, 1,
                    {"--role=sender", "--tokens=40", "--seed=7", "--say_published"}, limit);
  CHECK(absl::IsDeadlineExceeded(ReceiveFromStoppedSender(s)));
  CHECK(s.engine->counts().quarantined == 1);
  CHECK(s.engine->allocator().used_blocks() == 3);  // 40 tokens in 16-token blocks
  Stopwatch watch;
  if (sender_resumes) {
    // It now sees the init, puts the chunk into the quarantined blocks, then
    // the cancel; its FAILED notice, sent after the put, ends the quarantine.
    REQUIRE(kill(s.child->pid(), SIGCONT) == 0);
    CHECK(BlocksFreedWithin(*s.engine, absl::Seconds(4)));
    INFO("freed after " << absl::Nanoseconds(watch.ElapsedNanos()));
    CHECK(watch.ElapsedNanos() < absl::ToInt64Nanoseconds(limit));  // by the ack
    std::vector<std::string> f = Fields(s.child->ReadLine(Deadline::After(absl::Seconds(5))));
    INFO(absl::StrJoin(f, " "));
    CHECK(f[0] == "SENT");
  } else {
    CHECK(BlocksFreedWithin(*s.engine, limit + absl::Seconds(1)));  // bounded
    CHECK(watch.ElapsedNanos() >= absl::ToInt64Nanoseconds(limit) / 2);
    s.child->Kill();
  }
  CHECK(s.engine->counts().quarantined == 0);
}

TEST_CASE("a timed-out read-path receive frees its blocks at once; the stopped sender recovers") {
  // kGet: nothing writes into this process's blocks, so nothing is
  // quarantined. The sender, stopped past the receive's deadline, then sees
  // the init and the cancel, lends and ends the loan without anyone reading.
  Session s = Start({TransportProfile::kShm, DataPath::kGet}, "lang", 16, 1,
                    {"--role=sender", "--tokens=40", "--seed=7", "--say_published"});
  CHECK(absl::IsDeadlineExceeded(ReceiveFromStoppedSender(s)));
  CHECK(s.engine->counts().quarantined == 0);
  CHECK(s.engine->allocator().used_blocks() == 0);
  REQUIRE(kill(s.child->pid(), SIGCONT) == 0);
  std::vector<std::string> f = Fields(s.child->ReadLine(Deadline::After(absl::Seconds(5))));
  INFO(absl::StrJoin(f, " "));
  REQUIRE(f.size() == 3);
  CHECK(f[0] == "SENT");
  // Dropped by the cancel, or by its own deadline if its ticker ran first.
  CHECK((f[2] == std::to_string(static_cast<int>(absl::StatusCode::kCancelled)) ||
         f[2] == std::to_string(static_cast<int>(absl::StatusCode::kDeadlineExceeded))));
  CHECK(s.engine->counts().chunks_read == 0);
}

}  // namespace
}  // namespace mmserve::transfer
