// A decode side for multi-process KV hand-off tests: holds a KvCache of the
// given shape behind a KvHandoffReceiver and prints its target as one line
//   TARGET <hex worker address> <hex rkey> <base address>
// then answers "CRC <blocks...>" with "CRC <KvBlocksCrc>" until "EXIT".
//   kv_handoff_peer --profile=shm --layers=2 --blocks=64 --block_size=16 --kv_heads=2 --head_dim=64
//                   [--decode_kv=service|private]
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "transfer/kv_handoff.h"
#include "transfer/peer_process.h"

ABSL_FLAG(std::string, profile, "shm", "tcp or shm");
ABSL_FLAG(int64_t, layers, 2, "layers");
ABSL_FLAG(int64_t, blocks, 64, "blocks");
ABSL_FLAG(int64_t, block_size, 16, "tokens per block");
ABSL_FLAG(int64_t, kv_heads, 2, "KV heads");
ABSL_FLAG(int64_t, head_dim, 64, "head dim");
ABSL_FLAG(std::string, decode_kv, "service",
          "service: the cache as role decode makes it (KvHandoffReceiver::CreateWithCache: a "
          "shared segment senders map on shm, private memory on tcp); private: a KvCache in "
          "private memory, registered (KvHandoffReceiver::Create)");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace mmserve::transfer;  // NOLINT
  auto profile = ParseTransportProfile(absl::GetFlag(FLAGS_profile));
  CHECK(profile.ok()) << profile.status();
  auto ctx = UcxContext::Create(*profile);
  CHECK(ctx.ok()) << ctx.status();
  const mmserve::model::KvCacheShape shape = {.num_layers = absl::GetFlag(FLAGS_layers),
                                              .num_blocks = absl::GetFlag(FLAGS_blocks),
                                              .block_size = absl::GetFlag(FLAGS_block_size),
                                              .num_kv_heads = absl::GetFlag(FLAGS_kv_heads),
                                              .head_dim = absl::GetFlag(FLAGS_head_dim)};
  std::unique_ptr<mmserve::model::KvCache> private_cache;
  absl::StatusOr<std::unique_ptr<KvHandoffReceiver>> rx;
  const std::string layout = absl::GetFlag(FLAGS_decode_kv);
  CHECK(layout == "service" || layout == "private") << "--decode_kv=" << layout;
  if (layout == "service") {
    rx = KvHandoffReceiver::CreateWithCache(**ctx, shape, {.name = "kv-peer"});
  } else {
    auto cache = mmserve::model::KvCache::Create(shape);
    CHECK(cache.ok()) << cache.status();
    private_cache = std::move(*cache);
    rx = KvHandoffReceiver::Create(**ctx, *private_cache, {.name = "kv-peer"});
  }
  CHECK(rx.ok()) << rx.status();
  mmserve::model::KvCache* cache = private_cache ? private_cache.get() : (*rx)->owned_cache();
  const KvHandoffTarget& t = (*rx)->target();
  std::cout << "TARGET " << ToHex(t.worker_address) << " " << ToHex(t.rkey) << " " << t.base_address
            << std::endl;
  std::string line;
  while (std::getline(std::cin, line) && line != "EXIT") {
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.empty() || words[0] != "CRC") continue;
    std::vector<int32_t> blocks;
    for (size_t i = 1; i < words.size(); ++i) {
      int32_t b = 0;
      CHECK(absl::SimpleAtoi(words[i], &b));
      blocks.push_back(b);
    }
    CHECK((*rx)->AwaitLandedWrites().ok());
    std::cout << "CRC " << KvBlocksCrc(*cache, blocks) << std::endl;
  }
  return 0;
}
