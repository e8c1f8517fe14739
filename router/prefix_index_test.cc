#include "router/prefix_index.h"

#include <catch2/catch.hpp>
#include <vector>

namespace mmserve::router {
namespace {

namespace iv1 = ::mmserve::internal::v1;

iv1::LoadReport Listing(uint64_t epoch, std::vector<std::pair<uint64_t, uint32_t>> prefixes) {
  iv1::LoadReport r;
  r.set_prefix_epoch(epoch);
  for (const auto& [key, tokens] : prefixes) {
    iv1::CachedPrefix* p = r.add_cached_prefixes();
    p->set_key(key);
    p->set_tokens(tokens);
  }
  return r;
}

const absl::Time t0 = absl::FromUnixSeconds(1000);

TEST_CASE("the longest reported prefix of the request counts, per instance") {
  PrefixIndex index({});
  index.Update("a", Listing(1, {{11, 100}, {13, 300}}), t0);
  index.Update("b", Listing(1, {{12, 200}}), t0);
  const std::vector<uint64_t> keys = {11, 12, 13, 14};
  CHECK(index.CachedTokens("a", keys, t0) == 300);
  CHECK(index.CachedTokens("b", keys, t0) == 200);
  CHECK(index.CachedTokens("c", keys, t0) == 0);
  CHECK(index.CachedTokens("a", {{21, 22}}, t0) == 0);
  // How many of the keys the held one ends: the messages it covers.
  CHECK(index.HeldPrefix("a", keys, t0).keys == 3);
  CHECK(index.HeldPrefix("b", keys, t0).keys == 2);
  CHECK(index.HeldPrefix("b", keys, t0).tokens == 200);
  CHECK(index.HeldPrefix("c", keys, t0).keys == 0);
}

TEST_CASE("a report replaces the list before it unless its epoch is unchanged") {
  PrefixIndex index({});
  index.Update("a", Listing(1, {{11, 100}}), t0);
  // Same epoch: the list is not read again (an instance sends the same one).
  index.Update("a", Listing(1, {}), t0 + absl::Seconds(1));
  CHECK(index.CachedTokens("a", {{11}}, t0 + absl::Seconds(1)) == 100);
  index.Update("a", Listing(2, {{12, 50}}), t0 + absl::Seconds(2));
  CHECK(index.CachedTokens("a", {{11}}, t0 + absl::Seconds(2)) == 0);
  CHECK(index.CachedTokens("a", {{11, 12}}, t0 + absl::Seconds(2)) == 50);
  index.Remove("a");
  CHECK(index.CachedTokens("a", {{12}}, t0 + absl::Seconds(2)) == 0);
}

TEST_CASE("a stale report's list no longer counts") {
  PrefixIndex index({.max_age = absl::Seconds(5)});
  index.Update("a", Listing(1, {{11, 100}}), t0);
  CHECK(index.CachedTokens("a", {{11}}, t0 + absl::Seconds(5)) == 100);
  CHECK(index.CachedTokens("a", {{11}}, t0 + absl::Seconds(6)) == 0);
}

TEST_CASE("a placement counts until a report lists it or it expires") {
  PrefixIndex index({.placed_ttl = absl::Seconds(30)});
  index.Insert("a", 11, 120, t0);
  CHECK(index.CachedTokens("a", {{11, 12}}, t0) == 120);
  CHECK(index.HeldPrefix("a", {{11, 12}}, t0).keys == 1);
  // The report lists the prompt with its real length: that counts now.
  index.Update("a", Listing(1, {{11, 90}}), t0 + absl::Seconds(1));
  CHECK(index.CachedTokens("a", {{11}}, t0 + absl::Seconds(1)) == 90);
  index.Update("a", Listing(2, {}), t0 + absl::Seconds(2));
  CHECK(index.CachedTokens("a", {{11}}, t0 + absl::Seconds(2)) == 0);
  // Unlisted placements leave after placed_ttl.
  index.Insert("a", 12, 40, t0 + absl::Seconds(2));
  CHECK(index.CachedTokens("a", {{12}}, t0 + absl::Seconds(32)) == 40);
  CHECK(index.CachedTokens("a", {{12}}, t0 + absl::Seconds(33)) == 0);
  index.Update("a", Listing(2, {}), t0 + absl::Seconds(33));
  index.Update("a", Listing(3, {{12, 7}}), t0 + absl::Seconds(34));
  CHECK(index.CachedTokens("a", {{12}}, t0 + absl::Seconds(34)) == 7);
}

}  // namespace
}  // namespace mmserve::router
