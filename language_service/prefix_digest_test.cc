#include "language_service/prefix_digest.h"

#include <catch2/catch.hpp>

#include "scheduler/prompt_prefix.h"

namespace mmserve::language {
namespace {

std::vector<std::pair<uint64_t, uint32_t>> Listed(const PrefixDigest& digest, uint64_t* epoch) {
  internal::v1::LoadReport report;
  digest.Fill(report);
  *epoch = report.prefix_epoch();
  std::vector<std::pair<uint64_t, uint32_t>> out;
  for (const auto& p : report.cached_prefixes()) out.emplace_back(p.key(), p.tokens());
  return out;
}

TEST_CASE("the digest lists the newest prompts that fit in the KV pool, newest first") {
  PrefixDigest digest({.max_tokens = 1000, .max_entries = 3}, 40);
  uint64_t epoch = 0;
  CHECK(Listed(digest, &epoch).empty());
  CHECK(epoch == 40);
  digest.Record(1, 400);
  digest.Record(2, 400);
  CHECK(Listed(digest, &epoch) == std::vector<std::pair<uint64_t, uint32_t>>{{2, 400}, {1, 400}});
  CHECK(epoch == 42);
  // A third does not fit beside both: the oldest leaves.
  digest.Record(3, 300);
  CHECK(Listed(digest, &epoch) == std::vector<std::pair<uint64_t, uint32_t>>{{3, 300}, {2, 400}});
  // Computed again: first again, listed once.
  digest.Record(2, 400);
  CHECK(Listed(digest, &epoch) == std::vector<std::pair<uint64_t, uint32_t>>{{2, 400}, {3, 300}});
  // At most max_entries, and the newest even when it alone overflows.
  digest.Record(4, 10);
  digest.Record(5, 10);
  CHECK(digest.size() == 3);
  digest.Record(6, 5000);
  CHECK(Listed(digest, &epoch) == std::vector<std::pair<uint64_t, uint32_t>>{{6, 5000}});
}

TEST_CASE("a request's key is the router's key of its prompt, its images in index order") {
  internal::v1::PrefillRequest request;
  auto* m = request.mutable_chat()->add_messages();
  m->set_role("user");
  m->add_content()->mutable_image();
  m->add_content()->mutable_image();
  m->add_content()->set_text("compare them");
  for (uint32_t k : {1u, 0u}) {  // out of order on the wire
    auto* image = request.add_images();
    image->set_image_index(k);
    image->mutable_content_hash()->set_high(10 + k);
    image->mutable_content_hash()->set_low(20 + k);
  }
  double covered = 0;
  const uint64_t key = RequestPrefixKey(request, &covered);
  const ContentHash first{10, 20};
  const ContentHash second{11, 21};
  CHECK(key == scheduler::ChatPrefixKeys(request.chat(), {first, second}).keys.back());
  CHECK(covered == 1);
  internal::v1::PrefillRequest raw;
  raw.mutable_raw()->set_text("short");
  CHECK(RequestPrefixKey(raw, &covered) == 0);
}

}  // namespace
}  // namespace mmserve::language
