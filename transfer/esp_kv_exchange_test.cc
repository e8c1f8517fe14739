#include "transfer/esp_kv_exchange.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <thread>
#include <vector>

namespace mmserve::transfer {
namespace {

constexpr int64_t kLen = 37, kWidth = 16;
constexpr int kLayers = 5;

// The K (kv = 0) or V value of a token's lane at a layer.
float Value(int layer, int kv, int64_t row, int64_t lane) {
  return static_cast<float>(layer * 100000 + kv * 50000 + row * kWidth + lane) * 0.5f;
}

std::vector<std::vector<int64_t>> Stripes(int members) {
  std::vector<std::vector<int64_t>> rows(members);
  for (int64_t i = 0; i < kLen; ++i) rows[i % members].push_back(i);
  return rows;
}

std::vector<std::unique_ptr<UcxEspExchange>> Group(UcxContext& ctx,
                                                   const std::vector<std::vector<int64_t>>& rows,
                                                   absl::Duration timeout) {
  std::vector<std::unique_ptr<UcxEspExchange>> group;
  std::vector<EspExchangeTarget> targets;
  for (size_t m = 0; m < rows.size(); ++m) {
    auto ex = UcxEspExchange::Create(ctx, {rows, kLen, kWidth}, static_cast<int>(m),
                                     {.name = "esp-" + std::to_string(m)}, timeout);
    REQUIRE(ex.ok());
    targets.push_back((*ex)->target());
    group.push_back(std::move(ex).value());
  }
  for (auto& ex : group) REQUIRE(ex->Connect(targets).ok());
  return group;
}

// Member m's layers: its rows' K/V put in, the whole prompt's checked out.
absl::Status RunMember(UcxEspExchange& ex, const std::vector<int64_t>& rows, int layers,
                       bool* all_equal) {
  *all_equal = true;
  for (int layer = 0; layer < layers; ++layer) {
    std::vector<float> k(rows.size() * kWidth), v(rows.size() * kWidth);
    for (size_t i = 0; i < rows.size(); ++i) {
      for (int64_t c = 0; c < kWidth; ++c) {
        k[i * kWidth + c] = Value(layer, 0, rows[i], c);
        v[i * kWidth + c] = Value(layer, 1, rows[i], c);
      }
    }
    const float* k_all = nullptr;
    const float* v_all = nullptr;
    absl::Status s = ex.AllGather(layer, rows, k.data(), v.data(), &k_all, &v_all);
    if (!s.ok()) {
      ex.Abort();
      return s;
    }
    for (int64_t r = 0; r < kLen; ++r) {
      for (int64_t c = 0; c < kWidth; ++c) {
        *all_equal &= k_all[r * kWidth + c] == Value(layer, 0, r, c) &&
                      v_all[r * kWidth + c] == Value(layer, 1, r, c);
      }
    }
  }
  return absl::OkStatus();
}

TEST_CASE("every member gathers every row of every layer, over shm and tcp", "[esp]") {
  for (TransportProfile profile : {TransportProfile::kShm, TransportProfile::kTcp}) {
    CAPTURE(TransportProfileName(profile));
    auto ctx = UcxContext::Create(profile);
    REQUIRE(ctx.ok());
    for (int members : {2, 3}) {
      CAPTURE(members);
      const auto rows = Stripes(members);
      auto group = Group(**ctx, rows, absl::Seconds(30));
      std::vector<absl::Status> status(members);
      bool equal[3] = {false, false, false};
      std::vector<std::thread> threads;
      for (int m = 0; m < members; ++m) {
        threads.emplace_back(
            [&, m] { status[m] = RunMember(*group[m], rows[m], kLayers, &equal[m]); });
      }
      for (std::thread& t : threads) t.join();
      for (int m = 0; m < members; ++m) {
        CHECK(status[m].ok());
        CHECK(equal[m]);
      }
    }
  }
}

TEST_CASE("a member that fails aborts the others (UNAVAILABLE); one that never comes times out",
          "[esp]") {
  auto ctx = UcxContext::Create(TransportProfile::kShm);
  REQUIRE(ctx.ok());
  const auto rows = Stripes(2);
  {
    auto group = Group(**ctx, rows, absl::Seconds(30));
    group[1]->Abort();
    bool equal = false;
    CHECK(RunMember(*group[0], rows[0], kLayers, &equal).code() == absl::StatusCode::kUnavailable);
  }
  {
    auto group = Group(**ctx, rows, absl::Milliseconds(200));
    bool equal = false;
    CHECK(RunMember(*group[0], rows[0], kLayers, &equal).code() ==
          absl::StatusCode::kDeadlineExceeded);
  }
  CHECK(!UcxEspExchange::Create(**ctx, {{{0, 1}, {1, 2}}, 3, kWidth}, 0, {}, absl::Seconds(1))
             .ok());  // row 1 twice
}

}  // namespace
}  // namespace mmserve::transfer
