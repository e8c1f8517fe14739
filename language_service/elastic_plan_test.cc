// CheckElasticPlan: a plan splits a prompt's rows and KV exactly once.
#include "language_service/elastic_plan.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace mmserve::language {
namespace {

v1::ElasticMember Member(const std::string& id, std::vector<std::pair<uint32_t, uint32_t>> rows,
                         uint32_t keep_begin, uint32_t keep_end) {
  v1::ElasticMember m;
  m.set_instance_id(id);
  for (const auto& [b, e] : rows) {
    v1::ElasticRowRange* r = m.add_rows();
    r->set_begin(b);
    r->set_end(e);
  }
  m.mutable_keep()->set_begin(keep_begin);
  m.mutable_keep()->set_end(keep_end);
  return m;
}

// 10 rows over two members (striped), blocks of 4: a keeps [0, 4), b [4, 10).
v1::ElasticPlan Good() {
  v1::ElasticPlan p;
  *p.add_members() = Member("a", {{0, 3}, {6, 8}}, 0, 4);
  *p.add_members() = Member("b", {{3, 6}, {8, 10}}, 4, 10);
  p.set_sampler(1);
  p.set_master(1);
  return p;
}

// a keeps nothing of the prompt, b all of it.
v1::ElasticPlan EmptyKeepPlan() {
  v1::ElasticPlan p = Good();
  p.mutable_members(0)->mutable_keep()->set_end(0);
  p.mutable_members(1)->mutable_keep()->set_begin(0);
  return p;
}

TEST_CASE("a plan that splits rows and KV once passes", "[elastic_plan]") {
  CHECK(CheckElasticPlan(Good(), 10, 4).ok());
  CHECK(ElasticMemberRows(Good().members(0)) == std::vector<int32_t>{0, 1, 2, 6, 7});
  v1::ElasticPlan one;
  *one.add_members() = Member("a", {{0, 5}}, 0, 5);
  CHECK(CheckElasticPlan(one, 5, 4).ok());
  CHECK(CheckElasticPlan(EmptyKeepPlan(), 10, 4).ok());
}

TEST_CASE("plans that miss or repeat rows or KV are refused", "[elastic_plan]") {
  auto refused = [](const v1::ElasticPlan& p, uint32_t len = 10) {
    return CheckElasticPlan(p, len, 4).code() == absl::StatusCode::kInvalidArgument;
  };
  CHECK(refused(v1::ElasticPlan()));
  CHECK(refused(Good(), 11));  // rows short of the prompt
  CHECK(refused(Good(), 9));   // rows past it
  v1::ElasticPlan p = Good();
  p.mutable_members(1)->set_instance_id("a");
  CHECK(refused(p));  // one instance twice
  p = Good();
  p.mutable_members(0)->mutable_rows(0)->set_end(4);
  CHECK(refused(p));  // row 3 twice
  p = Good();
  p.mutable_members(0)->mutable_rows(1)->set_begin(2);
  CHECK(refused(p));  // not ascending
  p = Good();
  p.mutable_members(0)->mutable_keep()->set_end(5);
  CHECK(refused(p));  // KV of row 4 kept twice
  p = Good();
  p.mutable_members(0)->mutable_keep()->set_end(3);
  p.mutable_members(1)->mutable_keep()->set_begin(3);
  CHECK(refused(p));  // a span off a block boundary
  p = Good();
  p.set_sampler(0);
  CHECK(refused(p));  // a does not compute row 9
  p = Good();
  p.set_master(0);
  CHECK(refused(p));  // a's span does not end the prompt
  p = EmptyKeepPlan();
  p.set_master(0);
  CHECK(CheckElasticPlan(p, 10, 4).ok());  // a keeps only the decode tail
  p = Good();
  p.set_master(2);
  CHECK(refused(p));
}

void SetDecode(v1::ElasticPlan& p, int m, uint32_t begin, uint32_t end) {
  p.mutable_members(m)->mutable_decode()->set_begin(begin);
  p.mutable_members(m)->mutable_decode()->set_end(end);
}

TEST_CASE("decode ranges name a chain of masters after the prompt", "[elastic_plan]") {
  // b keeps [4, 10) and decodes [10, 12); a decodes [12, 20) after it.
  v1::ElasticPlan p = Good();
  p.mutable_members(0)->mutable_keep()->set_end(0);
  p.mutable_members(1)->mutable_keep()->set_begin(0);
  SetDecode(p, 1, 10, 12);
  SetDecode(p, 0, 12, 20);
  CHECK(CheckElasticPlan(p, 10, 4).ok());
  auto refused = [](const v1::ElasticPlan& q) {
    return CheckElasticPlan(q, 10, 4).code() == absl::StatusCode::kInvalidArgument;
  };
  v1::ElasticPlan q = p;
  SetDecode(q, 0, 13, 20);
  CHECK(refused(q));  // a gap
  q = p;
  SetDecode(q, 1, 11, 12);
  CHECK(refused(q));  // not right after the prompt
  q = p;
  q.set_master(0);
  q.mutable_members(0)->mutable_keep()->set_end(0);
  CHECK(refused(q));  // the first range is not the master's
  q = p;
  SetDecode(q, 0, 20, 12);
  CHECK(refused(q));  // reversed
  v1::ElasticPlan r = Good();
  SetDecode(r, 1, 10, 12);
  SetDecode(r, 0, 12, 20);
  CHECK(refused(r));  // a later master keeps part of the prompt
}

}  // namespace
}  // namespace mmserve::language
