// transfer_peer: one end of a multi-process transfer test or benchmark.
//
// Talks line by line over stdin/stdout with the parent (see peer_process.h):
//   -> INFO <hex ConnectRequest>      this engine's address and buffer
//   <- PEER <hex ConnectRequest>      the parent's
//   -> READY
//   sender:   -> SENT <k> <status code>           per image, as each completes
//   receiver: -> RECV <k> <status code> <chunks> <bytes ok|bad>   per image
//             -> BLOCKS <used>                    after the last image
//   <- EXIT (or EOF)                  then the engine shuts down and it exits 0
// Images are deterministic (payload_testing.h): image k of the --tokens list has
// seed --seed + (k mod list size), so the parent derives the same bytes.
#include <cstdio>
#include <deque>
#include <future>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "transfer/media_crc.h"
#include "transfer/payload_testing.h"
#include "transfer/peer_process.h"
#include "transfer/transfer_engine.h"

ABSL_FLAG(std::string, role, "sender", "sender or receiver");
ABSL_FLAG(std::string, profile, "shm", "tcp or shm");
ABSL_FLAG(std::string, id, "", "instance id (default: the role)");
ABSL_FLAG(std::string, peer_id, "", "the parent's instance id");
ABSL_FLAG(uint32_t, block_size, 16, "tokens per block");
ABSL_FLAG(uint32_t, num_blocks, 64, "blocks in the buffer");
ABSL_FLAG(uint32_t, default_blocks, 1, "blocks of a default allocation");
ABSL_FLAG(uint32_t, hidden, 64, "hidden size");
ABSL_FLAG(std::string, tokens, "100", "comma-separated image lengths");
ABSL_FLAG(bool, known, false, "receiver: allocate exactly (length known)");
ABSL_FLAG(uint64_t, seed, 1, "payload seed");
ABSL_FLAG(uint32_t, timeout_ms, 5000, "receiver: per-transfer deadline");
ABSL_FLAG(uint32_t, repeat, 1, "repeat the image list this often");
ABSL_FLAG(uint32_t, window, 2, "sender: images published ahead");
ABSL_FLAG(bool, stall_after_chunk, false, "receiver: block after the first chunk (fault tests)");
ABSL_FLAG(std::string, data_path, "", "put, tag or get (default: the profile's)");
ABSL_FLAG(int64_t, spin_us, -1,
          "progress thread busy-polls this long after the last activity (default: "
          "UcxWorkerOptions')");
ABSL_FLAG(bool, say_published, false,
          "sender: print PUBLISHED <k> once image k is queued to the engine (tests that "
          "stop this process must not stop it before)");
ABSL_FLAG(bool, reuse_payload, false,
          "sender: write (and checksum) each block run once (benchmarks)");

namespace mmserve::transfer {
namespace {

void Say(const std::string& line) {
  std::string l = line + "\n";
  fwrite(l.data(), 1, l.size(), stdout);
  fflush(stdout);
}

struct Image {
  std::string request_id;
  PayloadSpec spec;
};

std::vector<Image> Images() {
  std::vector<uint32_t> lengths;
  for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',')) {
    uint32_t n = 0;
    CHECK(absl::SimpleAtoi(t, &n)) << t;
    lengths.push_back(n);
  }
  std::vector<Image> images;
  for (uint32_t r = 0; r < absl::GetFlag(FLAGS_repeat); ++r) {
    for (size_t i = 0; i < lengths.size(); ++i) {
      images.push_back(
          {"req-" + std::to_string(images.size()), {absl::GetFlag(FLAGS_seed) + i, lengths[i], 0}});
    }
  }
  return images;
}

void RunSender(TransferEngine& engine, const std::vector<Image>& images) {
  absl::Mutex mu;
  int in_flight = 0;
  // --reuse_payload: block runs that already hold an image's bytes -> its seed
  // and checksum (an encoder computes it as it writes the embedding).
  std::map<std::pair<uint32_t, uint32_t>, std::pair<uint64_t, MediaCrc>> written;
  for (size_t k = 0; k < images.size(); ++k) {
    {
      absl::MutexLock lock(&mu);
      auto room = [&] { return in_flight < static_cast<int>(absl::GetFlag(FLAGS_window)); };
      mu.Await(absl::Condition(&room));
      ++in_flight;
    }
    const Image& image = images[k];
    absl::StatusOr<BlockAllocation> blocks = engine.allocator().AllocWait(
        image.spec.total_tokens, image.request_id, Deadline::After(absl::Seconds(60)));
    CHECK(blocks.ok()) << blocks.status();
    const std::pair<uint32_t, uint32_t> run{blocks->start_block, blocks->num_blocks};
    auto it = written.find(run);
    std::optional<MediaCrc> crc;
    if (absl::GetFlag(FLAGS_reuse_payload)) {
      if (it == written.end() || it->second.first != image.spec.seed) {
        WriteImage(engine.buffer(), *blocks, image.spec);
        it = written
                 .insert_or_assign(run, std::make_pair(image.spec.seed,
                                                       MediaCrc::Compute(engine.buffer(), *blocks)))
                 .first;
      }
      crc = it->second.second;
    } else {
      WriteImage(engine.buffer(), *blocks, image.spec);
    }
    engine.Publish(
        {.request_id = image.request_id,
         .blocks = *blocks,
         .keep_for = absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms))},
        [&mu, &in_flight, k](absl::Status s) {
          Say("SENT " + std::to_string(k) + " " + std::to_string(s.raw_code()));
          absl::MutexLock lock(&mu);
          --in_flight;
        },
        std::move(crc));
    // Publish queued it to the progress thread ahead of any init that
    // arrives from now on.
    if (absl::GetFlag(FLAGS_say_published)) Say("PUBLISHED " + std::to_string(k));
  }
  absl::MutexLock lock(&mu);
  auto idle = [&] { return in_flight == 0; };
  mu.Await(absl::Condition(&idle));
}

void RunReceiver(TransferEngine& engine, const std::vector<Image>& images,
                 const std::string& sender) {
  for (size_t k = 0; k < images.size(); ++k) {
    const Image& image = images[k];
    std::promise<absl::StatusOr<ReceivedMedia>> done;
    ReceiveRequest request{.request_id = image.request_id,
                           .sender = sender,
                           .known_tokens = absl::GetFlag(FLAGS_known) ? image.spec.total_tokens : 0,
                           .timeout = absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms))};
    if (absl::GetFlag(FLAGS_stall_after_chunk)) {
      request.on_chunk = [k](const v1::EmbeddingChunkNotice&) {
        Say("CHUNK " + std::to_string(k));
        while (true) absl::SleepFor(absl::Seconds(1));  // wedge until killed
      };
    }
    engine.Receive(std::move(request),
                   [&done](absl::StatusOr<ReceivedMedia> got) { done.set_value(std::move(got)); });
    absl::StatusOr<ReceivedMedia> got = done.get_future().get();
    bool ok = got.ok();
    for (int s = 0; ok && s < kNumSections; ++s) {
      ok = got->Section(s) == ExpectedSection(engine.buffer().layout(), image.spec, s);
    }
    Say("RECV " + std::to_string(k) + " " + std::to_string(got.status().raw_code()) + " " +
        std::to_string(got.ok() ? got->num_chunks() : 0) + " " + (ok ? "ok" : "bad"));
  }
  Say("BLOCKS " + std::to_string(engine.allocator().used_blocks()));
}

int Main() {
  const std::string role = absl::GetFlag(FLAGS_role);
  absl::StatusOr<TransportProfile> profile = ParseTransportProfile(absl::GetFlag(FLAGS_profile));
  CHECK(profile.ok()) << profile.status();
  TransferEngineOptions options{
      .instance_id = absl::GetFlag(FLAGS_id).empty() ? role : absl::GetFlag(FLAGS_id),
      .profile = *profile,
      .layout = {.block_size = absl::GetFlag(FLAGS_block_size),
                 .num_blocks = absl::GetFlag(FLAGS_num_blocks),
                 .hidden_size = absl::GetFlag(FLAGS_hidden),
                 .dtype_bytes = 2},
      .default_num_blocks = absl::GetFlag(FLAGS_default_blocks),
      .data_path = ParseDataPath(absl::GetFlag(FLAGS_data_path))};
  if (absl::GetFlag(FLAGS_spin_us) >= 0) {
    options.worker.spin = absl::Microseconds(absl::GetFlag(FLAGS_spin_us));
  }
  absl::StatusOr<std::unique_ptr<TransferEngine>> engine = TransferEngine::Create(options);
  CHECK(engine.ok()) << engine.status();
  Say("INFO " + ToHex((*engine)->local_info().SerializeAsString()));

  std::string line;
  CHECK(std::getline(std::cin, line) && line.rfind("PEER ", 0) == 0) << "expected PEER";
  v1::ConnectRequest peer;
  CHECK(peer.ParseFromString(FromHex(line.substr(5))));
  CHECK_OK((*engine)->Connect(peer));
  Say("READY");

  const std::vector<Image> images = Images();
  if (role == "sender") {
    RunSender(**engine, images);
  } else {
    RunReceiver(**engine, images, peer.instance_id());
  }
  while (std::getline(std::cin, line) && line != "EXIT") {
  }
  return 0;
}

}  // namespace
}  // namespace mmserve::transfer

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::transfer::Main();
}
