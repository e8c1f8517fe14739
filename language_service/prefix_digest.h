// The prompts a language instance computed lately, for its load report
// (LoadReport.cached_prefixes): the router sends a later request that
// extends one of them here, where its prefix's KV is likely still cached
// (docs/routing.md).
//
//   PrefixDigest digest({.max_tokens = kv_blocks * block_size}, RandomEpoch());
//   uint64_t key = RequestPrefixKey(prefill_request, &covered);  // at submit
//   digest.Record(key, prompt_tokens * covered);  // once its prompt's KV is computed
//   digest.Fill(report);                          // every load report
//
// The list is the most recent prompts, newest first, whose tokens together
// fit in the KV pool (older ones are likely evicted), and at most
// max_entries of them. The instance does not check its cache at report
// time: a prompt evicted early stays listed until newer prompts push it
// out.
//
// Not thread-safe: the language core's loop thread owns it.
#ifndef MMSERVE_LANGUAGE_SERVICE_PREFIX_DIGEST_H_
#define MMSERVE_LANGUAGE_SERVICE_PREFIX_DIGEST_H_

#include <cstdint>
#include <vector>

#include "proto/language.pb.h"
#include "proto/registry.pb.h"

namespace mmserve::language {

struct PrefixDigestOptions {
  // The KV pool, in tokens.
  uint64_t max_tokens = 0;
  size_t max_entries = 256;
};

// The last prefix key of the request's prompt (scheduler/prompt_prefix.h,
// as the router computes it) and in `covered` the share of the prompt it
// covers; 0 when the prompt has no key.
uint64_t RequestPrefixKey(const internal::v1::PrefillRequest& request, double* covered);

class PrefixDigest {
 public:
  // `epoch`: where prefix_epoch starts (differs between runs).
  PrefixDigest(const PrefixDigestOptions& options, uint64_t epoch)
      : options_(options), epoch_(epoch) {}

  // A prompt of `tokens` whose last key is `key` was computed: listed first.
  void Record(uint64_t key, uint32_t tokens);
  // Sets the report's cached_prefixes and prefix_epoch.
  void Fill(internal::v1::LoadReport& report) const;
  size_t size() const { return recent_.size(); }

 private:
  struct Entry {
    uint64_t key = 0;
    uint32_t tokens = 0;
  };
  const PrefixDigestOptions options_;
  uint64_t epoch_;
  std::vector<Entry> recent_;  // newest first
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_PREFIX_DIGEST_H_
