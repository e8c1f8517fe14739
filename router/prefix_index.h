// Which language instance holds the KV of which prompts, as the router
// knows it: each instance's load report lists the prompts it computed
// lately (LoadReport.cached_prefixes, keyed by scheduler/prompt_prefix.h),
// and the router adds what it placed itself until a report lists it. A
// placer asks how many tokens of a new request's prompt an instance would
// find cached (docs/routing.md has the cost this feeds).
//
//   PrefixIndex index({});
//   index.Update("a", report, absl::Now());            // every load report
//   index.Insert("a", keys.back(), tokens, absl::Now());  // a placement
//   uint64_t cached = index.CachedTokens("a", keys, absl::Now());
//
// How stale it can be: a report's list counts for options.max_age after
// the report came (the instance table polls every --poll_ms), and the
// instance lists a prompt from its end until newer prompts fill its KV
// pool; blocks the instance evicted earlier still attract a request, which
// then recomputes them as it would elsewhere.
//
// Thread-safe.
#ifndef MMSERVE_ROUTER_PREFIX_INDEX_H_
#define MMSERVE_ROUTER_PREFIX_INDEX_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/registry.pb.h"

namespace mmserve::router {

struct PrefixIndexOptions {
  // What a token found cached weighs against a token of load (router
  // --prefix_weight); 0 turns prefix-aware placement off.
  double weight = 1.0;
  // A report's list counts this long after the report came.
  absl::Duration max_age = absl::Seconds(5);
  // A placement counts this long, unless a report lists it first.
  absl::Duration placed_ttl = absl::Seconds(30);
};

class PrefixIndex {
 public:
  explicit PrefixIndex(const PrefixIndexOptions& options) : options_(options) {}
  const PrefixIndexOptions& options() const { return options_; }

  // `instance`'s report, got at `at`: its list replaces the one reported
  // before (an unchanged prefix_epoch only refreshes it), and placements
  // it lists leave.
  void Update(const std::string& instance, const internal::v1::LoadReport& report, absl::Time at);
  // The router placed a prompt of `tokens` whose last prefix key is `key`.
  void Insert(const std::string& instance, uint64_t key, uint64_t tokens, absl::Time at);
  void Remove(const std::string& instance);
  // What `instance` holds of a prompt as of `now`: the longest of its
  // prefix keys (shortest first) the instance holds, as the number of keys
  // through that one and the tokens it covers; zeros when none.
  struct Held {
    size_t keys = 0;
    uint64_t tokens = 0;
  };
  Held HeldPrefix(const std::string& instance, absl::Span<const uint64_t> keys,
                  absl::Time now) const;
  // The tokens of HeldPrefix.
  uint64_t CachedTokens(const std::string& instance, absl::Span<const uint64_t> keys,
                        absl::Time now) const {
    return HeldPrefix(instance, keys, now).tokens;
  }

 private:
  struct Placed {
    uint64_t tokens = 0;
    absl::Time at;
  };
  struct Holder {
    bool has_epoch = false;
    uint64_t epoch = 0;
    absl::Time reported_at = absl::InfinitePast();
    absl::flat_hash_map<uint64_t, uint32_t> reported;  // key -> tokens
    absl::flat_hash_map<uint64_t, Placed> placed;
  };

  const PrefixIndexOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, Holder> holders_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_PREFIX_INDEX_H_
