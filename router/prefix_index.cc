#include "router/prefix_index.h"

#include <algorithm>

namespace mmserve::router {

void PrefixIndex::Update(const std::string& instance, const internal::v1::LoadReport& report,
                         absl::Time at) {
  absl::MutexLock lock(&mu_);
  Holder& h = holders_[instance];
  h.reported_at = at;
  if (!h.has_epoch || h.epoch != report.prefix_epoch()) {
    h.has_epoch = true;
    h.epoch = report.prefix_epoch();
    h.reported.clear();
    for (const internal::v1::CachedPrefix& p : report.cached_prefixes()) {
      h.reported.emplace(p.key(), p.tokens());
    }
  }
  absl::erase_if(h.placed, [&](const auto& kv) {
    return h.reported.contains(kv.first) || at - kv.second.at > options_.placed_ttl;
  });
}

void PrefixIndex::Insert(const std::string& instance, uint64_t key, uint64_t tokens,
                         absl::Time at) {
  absl::MutexLock lock(&mu_);
  holders_[instance].placed[key] = {.tokens = tokens, .at = at};
}

void PrefixIndex::Remove(const std::string& instance) {
  absl::MutexLock lock(&mu_);
  holders_.erase(instance);
}

PrefixIndex::Held PrefixIndex::HeldPrefix(const std::string& instance,
                                          absl::Span<const uint64_t> keys, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  auto it = holders_.find(instance);
  if (it == holders_.end()) return {};
  const Holder& h = it->second;
  const bool fresh = now - h.reported_at <= options_.max_age;
  for (size_t k = keys.size(); k-- > 0;) {
    if (fresh) {
      if (auto r = h.reported.find(keys[k]); r != h.reported.end()) {
        return {.keys = k + 1, .tokens = r->second};
      }
    }
    if (auto p = h.placed.find(keys[k]);
        p != h.placed.end() && now - p->second.at <= options_.placed_ttl) {
      return {.keys = k + 1, .tokens = p->second.tokens};
    }
  }
  return {};
}

}  // namespace mmserve::router
