#include "transfer/elastic_span_attention.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace mmserve::transfer {
namespace {

constexpr ElasticSpanShape kShape{/*parties=*/3, /*max_rows=*/4, /*q_width=*/24, /*heads=*/3};

// What server `self` answers: out = q * (layer + 1) + self, lse = tag + head.
absl::Status Answer(int self, int layer, absl::Span<const uint64_t> tags, const float* q,
                    int64_t rows, float* out, float* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < kShape.q_width; ++i) {
      out[r * kShape.q_width + i] = q[r * kShape.q_width + i] * (layer + 1) + self;
    }
    for (int64_t h = 0; h < kShape.heads; ++h) {
      lse[r * kShape.heads + h] = static_cast<float>(tags[r] + h);
    }
  }
  return absl::OkStatus();
}

struct Pool {
  std::unique_ptr<UcxSpanPeers> master;                     // party 0
  std::vector<std::unique_ptr<ElasticSpanServer>> servers;  // parties 1, 2
};

Pool MakePool(UcxContext& ctx, absl::Duration timeout) {
  Pool p;
  auto master = UcxSpanPeers::Create(ctx, kShape, 0, {.name = "master"}, timeout);
  REQUIRE(master.ok());
  p.master = std::move(master).value();
  std::vector<NoticeBoardTarget> servers(3), clients(3);
  clients[0] = p.master->target();
  for (int s = 1; s <= 2; ++s) {
    auto server = ElasticSpanServer::Create(
        ctx, kShape, s,
        [s](int layer, absl::Span<const uint64_t> tags, const float* q, int64_t rows, float* out,
            float* lse) { return Answer(s, layer, tags, q, rows, out, lse); },
        {.name = "holder-" + std::to_string(s)});
    REQUIRE(server.ok());
    servers[s] = (*server)->target();
    p.servers.push_back(std::move(server).value());
  }
  for (auto& s : p.servers) REQUIRE(s->Connect(clients).ok());
  REQUIRE(p.master->Connect(servers).ok());
  return p;
}

TEST_CASE("the master's queries reach each holder and its partials come back", "[elastic]") {
  for (TransportProfile profile : {TransportProfile::kShm, TransportProfile::kTcp}) {
    CAPTURE(TransportProfileName(profile));
    auto ctx = UcxContext::Create(profile);
    REQUIRE(ctx.ok());
    Pool pool = MakePool(**ctx, absl::Seconds(30));
    // Span order: holder 2, the master, holder 1.
    pool.master->SetBatch({2, 0, 1}, 1, {7, 9, 11});
    CHECK(pool.master->num_members() == 3);
    CHECK(pool.master->self() == 1);
    const int64_t rows = 3;
    std::vector<float> q(rows * kShape.q_width);
    for (size_t i = 0; i < q.size(); ++i) q[i] = 0.25f * static_cast<float>(i);
    for (int layer = 0; layer < 4; ++layer) {
      for (int member : {0, 2}) {
        const int party = member == 0 ? 2 : 1;
        std::vector<float> out(rows * kShape.q_width), lse(rows * kShape.heads);
        REQUIRE(pool.master->Query(member, layer, q.data(), rows, out.data(), lse.data()).ok());
        std::vector<float> want_out(out.size()), want_lse(lse.size());
        const std::vector<uint64_t> tags = {7, 9, 11};
        REQUIRE(Answer(party, layer, tags, q.data(), rows, want_out.data(), want_lse.data()).ok());
        CHECK(out == want_out);
        CHECK(lse == want_lse);
      }
    }
    std::vector<float> out(kShape.q_width), lse(kShape.heads);
    CHECK(pool.master->Query(1, 0, q.data(), 3, out.data(), lse.data()).code() ==
          absl::StatusCode::kInvalidArgument);  // itself
  }
}

TEST_CASE("a holder that is gone: the query ends within the master's timeout", "[elastic]") {
  auto ctx = UcxContext::Create(TransportProfile::kShm);
  REQUIRE(ctx.ok());
  Pool pool = MakePool(**ctx, absl::Milliseconds(300));
  pool.servers[0].reset();  // party 1 stops answering
  pool.master->SetBatch({1, 0}, 1, {5});
  std::vector<float> q(kShape.q_width, 1.0f), out(kShape.q_width), lse(kShape.heads);
  const absl::Status s = pool.master->Query(0, 0, q.data(), 1, out.data(), lse.data());
  CHECK((s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace mmserve::transfer
