// Helpers of the tests that serve group prefills on in-process elastic
// instances (roles_testing.h) over real gRPC and UCX: hand-built plans,
// every member's ElasticPrefill at once, and the checks that nothing is
// left held.
#ifndef MMSERVE_LANGUAGE_SERVICE_ELASTIC_SERVE_TESTING_H_
#define MMSERVE_LANGUAGE_SERVICE_ELASTIC_SERVE_TESTING_H_

#include <algorithm>
#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "language_service/roles_testing.h"

namespace mmserve::language::testing {

inline constexpr int kBlock = 4;  // roles_testing's engine block size

// One stream's batches, with the prompt length when usage came.
struct Stream {
  Output out;
  uint32_t prompt_tokens = 0;
};

template <typename Reader>
inline void DrainUsage(Reader& reader, Stream* s) {
  v1::TokenBatch b;
  while (reader->Read(&b)) {
    s->out.tokens.insert(s->out.tokens.end(), b.token_ids().begin(), b.token_ids().end());
    s->out.text += b.text();
    if (b.has_usage()) s->prompt_tokens = b.usage().prompt_tokens();
    if (b.finish_reason() != mmserve::v1::FINISH_REASON_UNSPECIFIED) {
      s->out.finish = b.finish_reason();
    }
  }
  s->out.status = reader->Finish();
}

inline Stream RunBothWithUsage(Instance& both, const v1::PrefillRequest& request) {
  grpc::ClientContext ctx;
  auto reader = both.stub->Prefill(&ctx, request);
  Stream s;
  DrainUsage(reader, &s);
  return s;
}

struct Share {
  uint32_t begin = 0, end = 0;            // rows computed
  uint32_t keep_begin = 0, keep_end = 0;  // the span kept
};

inline v1::ElasticPlan MakePlan(const std::vector<Instance*>& members,
                                const std::vector<Share>& shares, uint32_t sampler,
                                uint32_t master) {
  v1::ElasticPlan plan;
  for (size_t m = 0; m < members.size(); ++m) {
    v1::ElasticMember* e = plan.add_members();
    e->set_instance_id("elastic-" + std::to_string(m));
    v1::ElasticRowRange* rows = e->add_rows();
    rows->set_begin(shares[m].begin);
    rows->set_end(shares[m].end);
    e->mutable_keep()->set_begin(shares[m].keep_begin);
    e->mutable_keep()->set_end(shares[m].keep_end);
    e->set_endpoint(members[m]->core->role().elastic_calls()->endpoint());
  }
  plan.set_sampler(sampler);
  plan.set_master(master);
  return plan;
}

// Contiguous near-equal rows, block-aligned spans; the last member samples
// and masters.
inline std::vector<Share> EvenShares(uint32_t len, int n) {
  std::vector<Share> s(n);
  for (int m = 0; m < n; ++m) {
    s[m].begin = len * m / n;
    s[m].end = len * (m + 1) / n;
    s[m].keep_begin = m == 0 ? 0 : s[m - 1].keep_end;
    s[m].keep_end = m == n - 1 ? len : std::max(s[m].keep_begin, s[m].end / kBlock * kBlock);
  }
  return s;
}

// Member m's ElasticPrefill call of `plan` for `request`.
inline v1::ElasticPrefillRequest MemberCall(const v1::ElasticPlan& plan, v1::PrefillRequest request,
                                            size_t m) {
  v1::ElasticPrefillRequest r;
  *r.mutable_request() = std::move(request);
  *r.mutable_plan() = plan;
  r.set_member(static_cast<uint32_t>(m));
  return r;
}

// Abort(id) on every member, then nothing is left on any.
inline void AbortAndCheckIdle(const std::vector<Instance*>& members, const std::string& id) {
  for (Instance* i : members) {
    v1::AbortRequest a;
    a.set_request_id(id);
    v1::AbortResponse ar;
    grpc::ClientContext ctx;
    REQUIRE(i->stub->Abort(&ctx, a, &ar).ok());
  }
  for (Instance* i : members) {
    CHECK(i->Idle());
    CHECK(i->core->role().elastic_calls()->num_held_spans() == 0);
  }
}

// Every member's ElasticPrefill at once; request(m) is member m's copy.
inline std::vector<Stream> RunGroup(const std::vector<Instance*>& members,
                                    const v1::ElasticPlan& plan,
                                    const std::function<v1::PrefillRequest(int)>& request) {
  std::vector<Stream> out(members.size());
  std::vector<std::thread> threads;
  for (size_t m = 0; m < members.size(); ++m) {
    threads.emplace_back([&, m] {
      grpc::ClientContext ctx;
      auto reader =
          members[m]->stub->ElasticPrefill(&ctx, MemberCall(plan, request(static_cast<int>(m)), m));
      DrainUsage(reader, &out[m]);
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

// Blocks in use once the load report settles on `want`.
inline uint32_t UsedBlocks(Instance& i, uint32_t want) {
  const Deadline d = Deadline::After(absl::Seconds(5));
  uint32_t used = 0;
  do {
    used = i.core->Capacity().kv_blocks_total() - i.core->Load().kv_blocks_free();
    if (used == want) break;
    absl::SleepFor(absl::Milliseconds(5));
  } while (!d.Expired());
  return used;
}

inline uint32_t Blocks(uint32_t tokens) { return (tokens + kBlock - 1) / kBlock; }

}  // namespace mmserve::language::testing

#endif  // MMSERVE_LANGUAGE_SERVICE_ELASTIC_SERVE_TESTING_H_
