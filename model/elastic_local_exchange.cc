#include "model/elastic_local_exchange.h"

#include <cstring>

namespace mmserve::model {

class InProcessKvGroup::Member : public KvExchange {
 public:
  explicit Member(InProcessKvGroup* group) : group_(group) {}
  absl::Status AllGather(int layer, absl::Span<const int64_t> rows, const float* k, const float* v,
                         const float** k_all, const float** v_all) override {
    return group_->AllGather(layer, rows, k, v, k_all, v_all);
  }
  void Abort() override { group_->Abort(); }

 private:
  InProcessKvGroup* group_;
};

InProcessKvGroup::InProcessKvGroup(int members, int num_layers, int64_t prompt_len,
                                   int64_t kv_width, absl::Duration timeout)
    : num_members_(members),
      prompt_len_(prompt_len),
      kv_width_(kv_width),
      timeout_(timeout),
      k_(num_layers, std::vector<float>(prompt_len * kv_width)),
      v_(num_layers, std::vector<float>(prompt_len * kv_width)),
      arrived_(num_layers, 0),
      rows_seen_(num_layers, 0),
      written_(num_layers, std::vector<bool>(prompt_len, false)) {
  for (int m = 0; m < members; ++m) members_.push_back(std::make_unique<Member>(this));
}

InProcessKvGroup::~InProcessKvGroup() = default;

KvExchange& InProcessKvGroup::member(int m) { return *members_[m]; }

absl::Status InProcessKvGroup::AllGather(int layer, absl::Span<const int64_t> rows, const float* k,
                                         const float* v, const float** k_all, const float** v_all) {
  absl::MutexLock lock(&mu_);
  if (layer < 0 || layer >= static_cast<int>(arrived_.size())) {
    return absl::InvalidArgumentError("layer out of range");
  }
  if (aborted_) return absl::UnavailableError("a member of the prefill group failed");
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t g = rows[i];
    if (g < 0 || g >= prompt_len_ || written_[layer][g]) {
      overlap_ = true;
      continue;
    }
    written_[layer][g] = true;
    std::memcpy(&k_[layer][g * kv_width_], k + i * kv_width_, kv_width_ * sizeof(float));
    std::memcpy(&v_[layer][g * kv_width_], v + i * kv_width_, kv_width_ * sizeof(float));
  }
  rows_seen_[layer] += static_cast<int64_t>(rows.size());
  ++arrived_[layer];
  auto done = [this, layer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return aborted_ || arrived_[layer] == num_members_;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout_)) {
    aborted_ = true;
    return absl::DeadlineExceededError("the prefill group's K/V exchange timed out");
  }
  if (aborted_) return absl::UnavailableError("a member of the prefill group failed");
  if (overlap_ || rows_seen_[layer] != prompt_len_) {
    return absl::InternalError("the members' rows do not cover the prompt exactly once");
  }
  *k_all = k_[layer].data();
  *v_all = v_[layer].data();
  return absl::OkStatus();
}

void InProcessKvGroup::Abort() {
  absl::MutexLock lock(&mu_);
  aborted_ = true;
}

}  // namespace mmserve::model
