#include "scheduler/placement.h"

#include <catch2/catch.hpp>
#include <map>

namespace mmserve::scheduler {
namespace {

TEST_CASE("rendezvous picks the same candidate for the same key whatever the order") {
  const ContentHash key = HashBytes("image bytes");
  const std::vector<std::string> a = {"encoder-0", "encoder-1", "encoder-2"};
  const std::vector<std::string> b = {"encoder-2", "encoder-0", "encoder-1"};
  CHECK(a[RendezvousPick(key, a)] == b[RendezvousPick(key, b)]);
  CHECK(RendezvousPick(key, {}) == kNoCandidate);
}

TEST_CASE("removing a candidate moves only the keys it owned, and keys spread evenly") {
  const std::vector<std::string> all = {"e0", "e1", "e2", "e3"};
  const std::vector<std::string> without_e1 = {"e0", "e2", "e3"};
  std::map<std::string, int> count;
  int moved = 0;
  for (int i = 0; i < 4000; ++i) {
    const ContentHash key = HashBytes("img" + std::to_string(i));
    const std::string before = all[RendezvousPick(key, all)];
    const std::string after = without_e1[RendezvousPick(key, without_e1)];
    ++count[before];
    if (before != "e1") {
      CHECK(after == before);
    } else {
      ++moved;
    }
  }
  CHECK(moved == count["e1"]);
  for (const auto& [id, n] : count) {
    CHECK(n > 800);
    CHECK(n < 1200);
  }
}

TEST_CASE("least loaded takes the smallest load, the first among equals") {
  CHECK(LeastLoaded({5, 3, 3, 9}) == 1);
  CHECK(LeastLoaded({0}) == 0);
  CHECK(LeastLoaded({}) == kNoCandidate);
}

}  // namespace
}  // namespace mmserve::scheduler
