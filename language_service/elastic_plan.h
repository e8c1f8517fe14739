// Checks of an elastic-sequence-parallelism group plan (proto ElasticPlan)
// before any member acts on it: every member refuses a plan that
// does not split the prompt's rows and its KV exactly once.
//
//   RETURN_IF_ERROR(CheckElasticPlan(plan, prompt_len, block_size));
//
// Thread-safety: pure functions.
#ifndef MMSERVE_LANGUAGE_SERVICE_ELASTIC_PLAN_H_
#define MMSERVE_LANGUAGE_SERVICE_ELASTIC_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "proto/language.pb.h"

namespace mmserve::language {

namespace v1 = ::mmserve::internal::v1;

inline constexpr int kMaxElasticMembers = 16;

// InvalidArgument unless: 1..kMaxElasticMembers members with distinct non-empty
// instance ids; each member's rows ascending, non-empty and disjoint, all
// members' rows together exactly [0, prompt_len); the keep ranges
// together exactly [0, prompt_len), each non-empty one starting on a
// multiple of block_size; the sampler computes row prompt_len - 1; the
// master keeps the range that ends at prompt_len or none of the prompt
// (its span is then only the decode tail); the non-empty decode ranges, if
// any, tile [prompt_len, the last one's end) in order, the first is the
// master's and the later members keep none of the prompt.
[[nodiscard]] absl::Status CheckElasticPlan(const v1::ElasticPlan& plan, uint32_t prompt_len,
                                            uint32_t block_size);

// The global rows a member computes, ascending (plan checked).
std::vector<int32_t> ElasticMemberRows(const v1::ElasticMember& member);

// The masters in decode order (plan checked): the members with decode
// ranges by their begin, or plan.master alone when none has one.
std::vector<int> ElasticMasterChain(const v1::ElasticPlan& plan);

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_ELASTIC_PLAN_H_
