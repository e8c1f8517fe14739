#include "router/elastic_group_plan.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace mmserve::router {
namespace {

namespace iv1 = ::mmserve::internal::v1;

// Member `m` of `n`'s run of `len` rows: [len * m / n, len * (m + 1) / n).
void SetRows(int64_t len, size_t m, size_t n, iv1::ElasticMember* member) {
  const int64_t begin = len * static_cast<int64_t>(m) / static_cast<int64_t>(n);
  const int64_t end = len * static_cast<int64_t>(m + 1) / static_cast<int64_t>(n);
  if (begin == end) return;
  iv1::ElasticRowRange* r = member->add_rows();
  r->set_begin(static_cast<uint32_t>(begin));
  r->set_end(static_cast<uint32_t>(end));
}

}  // namespace

absl::StatusOr<iv1::ElasticPlan> ElasticWirePlan(const scheduler::ElasticBatchPlan& batch,
                                                 const scheduler::ElasticRequestPlan& request,
                                                 const std::vector<std::string>& instance_ids) {
  const size_t n = batch.instances.size();
  const int64_t len = request.input_len;
  if (n == 0 || len <= 0) return absl::InternalError("elastic batch without instances or prompt");
  iv1::ElasticPlan plan;
  for (size_t m = 0; m < n; ++m) {
    const int id = batch.instances[m];
    if (id < 0 || static_cast<size_t>(id) >= instance_ids.size()) {
      return absl::InternalError(absl::StrCat("elastic batch names unknown instance ", id));
    }
    iv1::ElasticMember* member = plan.add_members();
    member->set_instance_id(instance_ids[static_cast<size_t>(id)]);
    SetRows(len, m, n, member);
    if (id == request.master) plan.set_master(static_cast<uint32_t>(m));
  }
  bool decodes = false;  // some member has a decode range
  plan.set_sampler(static_cast<uint32_t>(n - 1));
  std::vector<bool> kept(n, false);
  for (const scheduler::ElasticSpan& span : request.spans) {
    const auto it = std::find(batch.instances.begin(), batch.instances.end(), span.instance);
    const size_t m = static_cast<size_t>(it - batch.instances.begin());
    if (it == batch.instances.end() || kept[m]) {
      return absl::InternalError(absl::StrCat("elastic span on instance ", span.instance,
                                              " outside its batch or repeated"));
    }
    kept[m] = true;
    const int64_t begin = std::min(span.begin, len), end = std::min(span.end, len);
    iv1::ElasticRowRange* keep = plan.mutable_members(static_cast<int>(m))->mutable_keep();
    keep->set_begin(static_cast<uint32_t>(begin == end ? 0 : begin));
    keep->set_end(static_cast<uint32_t>(begin == end ? 0 : end));
    // The decode tail past the prompt: its holder masters those tokens, the
    // one holding the prompt's end (or starting at it) first.
    if (span.end > len) {
      iv1::ElasticRowRange* decode = plan.mutable_members(static_cast<int>(m))->mutable_decode();
      decode->set_begin(static_cast<uint32_t>(std::max(span.begin, len)));
      decode->set_end(static_cast<uint32_t>(span.end));
      if (span.begin <= len) plan.set_master(static_cast<uint32_t>(m));
      decodes = true;
    }
  }
  if (std::find(batch.instances.begin(), batch.instances.end(), request.master) ==
          batch.instances.end() ||
      (decodes && plan.members(static_cast<int>(plan.master())).decode().begin() != len)) {
    return absl::InternalError("elastic master outside its batch, or the decode tail not after it");
  }
  return plan;
}

}  // namespace mmserve::router
