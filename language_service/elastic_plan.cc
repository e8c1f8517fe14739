#include "language_service/elastic_plan.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mmserve::language {
namespace {

using Range = std::pair<uint32_t, uint32_t>;

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("elastic plan: ", what));
}

// Whether `ranges` (any order) tile [0, n) exactly.
bool Tiles(std::vector<Range> ranges, uint32_t n) {
  std::sort(ranges.begin(), ranges.end());
  uint32_t next = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != next) return false;
    next = end;
  }
  return next == n;
}

bool Contains(const v1::ElasticMember& m, uint32_t row) {
  for (const v1::ElasticRowRange& r : m.rows()) {
    if (r.begin() <= row && row < r.end()) return true;
  }
  return false;
}

// Each member's rows ascending and non-empty; together they tile the prompt.
absl::Status CheckRows(const v1::ElasticPlan& plan, uint32_t prompt_len) {
  std::vector<Range> all;
  for (int i = 0; i < plan.members_size(); ++i) {
    uint32_t last_end = 0;
    for (const v1::ElasticRowRange& r : plan.members(i).rows()) {
      if (r.begin() >= r.end() || r.begin() < last_end) {
        return Invalid(absl::StrCat("member ", i, "'s rows are empty or not ascending"));
      }
      last_end = r.end();
      all.emplace_back(r.begin(), r.end());
    }
  }
  if (!Tiles(std::move(all), prompt_len)) {
    return Invalid(absl::StrCat("the members' rows do not cover ", prompt_len, " rows once"));
  }
  return absl::OkStatus();
}

// The keep ranges tile the prompt, each non-empty one block-aligned.
absl::Status CheckKeep(const v1::ElasticPlan& plan, uint32_t prompt_len, uint32_t block_size) {
  std::vector<Range> kept;
  for (int i = 0; i < plan.members_size(); ++i) {
    const v1::ElasticRowRange& k = plan.members(i).keep();
    if (k.begin() > k.end()) return Invalid(absl::StrCat("member ", i, "'s span is reversed"));
    if (k.begin() == k.end()) continue;
    if (k.begin() % block_size != 0) {
      return Invalid(absl::StrCat("member ", i, "'s span does not start on a block"));
    }
    kept.emplace_back(k.begin(), k.end());
  }
  if (!Tiles(std::move(kept), prompt_len)) {
    return Invalid(absl::StrCat("the spans do not cover ", prompt_len, " tokens once"));
  }
  return absl::OkStatus();
}

// The decode ranges, when any: they tile [prompt_len, end) in order, the
// first is the master's, the later ones' members keep none of the prompt.
absl::Status CheckDecode(const v1::ElasticPlan& plan, uint32_t prompt_len) {
  std::vector<std::pair<Range, int>> ranges;
  for (int i = 0; i < plan.members_size(); ++i) {
    const v1::ElasticRowRange& d = plan.members(i).decode();
    if (d.begin() > d.end()) return Invalid(absl::StrCat("member ", i, "'s decode is reversed"));
    if (d.begin() < d.end()) ranges.push_back({{d.begin(), d.end()}, i});
  }
  if (ranges.empty()) return absl::OkStatus();
  std::sort(ranges.begin(), ranges.end());
  if (ranges[0].second != static_cast<int>(plan.master())) {
    return Invalid("the master must decode first");
  }
  uint32_t next = prompt_len;
  for (size_t c = 0; c < ranges.size(); ++c) {
    const auto& [range, member] = ranges[c];
    const v1::ElasticRowRange& keep = plan.members(member).keep();
    if (range.first != next || (c > 0 && keep.begin() != keep.end())) {
      return Invalid(
          "the decode ranges must follow the prompt and each other, and only the "
          "first master may keep part of the prompt");
    }
    next = range.second;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckElasticPlan(const v1::ElasticPlan& plan, uint32_t prompt_len,
                              uint32_t block_size) {
  const int n = plan.members_size();
  if (n < 1 || n > kMaxElasticMembers) return Invalid(absl::StrCat(n, " members"));
  if (prompt_len == 0 || block_size == 0) return Invalid("an empty prompt or block");
  std::set<std::string> ids;
  for (const v1::ElasticMember& m : plan.members()) {
    if (m.instance_id().empty() || !ids.insert(m.instance_id()).second) {
      return Invalid("member instance ids must be distinct and non-empty");
    }
  }
  if (absl::Status s = CheckRows(plan, prompt_len); !s.ok()) return s;
  if (absl::Status s = CheckKeep(plan, prompt_len, block_size); !s.ok()) return s;
  if (plan.sampler() >= static_cast<uint32_t>(n) ||
      !Contains(plan.members(static_cast<int>(plan.sampler())), prompt_len - 1)) {
    return Invalid("the sampler must compute the last row");
  }
  if (plan.master() >= static_cast<uint32_t>(n)) return Invalid("no such master");
  const v1::ElasticRowRange& master = plan.members(static_cast<int>(plan.master())).keep();
  if (master.begin() != master.end() && master.end() != prompt_len) {
    return Invalid("the master must keep the span that ends the prompt, or none");
  }
  return CheckDecode(plan, prompt_len);
}

std::vector<int32_t> ElasticMemberRows(const v1::ElasticMember& member) {
  std::vector<int32_t> rows;
  for (const v1::ElasticRowRange& r : member.rows()) {
    for (uint32_t i = r.begin(); i < r.end(); ++i) rows.push_back(static_cast<int32_t>(i));
  }
  return rows;
}

std::vector<int> ElasticMasterChain(const v1::ElasticPlan& plan) {
  std::vector<std::pair<uint32_t, int>> ranges;  // (begin, member)
  for (int m = 0; m < plan.members_size(); ++m) {
    const v1::ElasticRowRange& d = plan.members(m).decode();
    if (d.begin() < d.end()) ranges.emplace_back(d.begin(), m);
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<int> chain;
  for (const auto& [begin, m] : ranges) chain.push_back(m);
  if (chain.empty()) chain.push_back(static_cast<int>(plan.master()));
  return chain;
}

}  // namespace mmserve::language
