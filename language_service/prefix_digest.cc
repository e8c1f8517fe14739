#include "language_service/prefix_digest.h"

#include <algorithm>

#include "common/hash.h"
#include "scheduler/prompt_prefix.h"

namespace mmserve::language {

uint64_t RequestPrefixKey(const internal::v1::PrefillRequest& request, double* covered) {
  std::vector<const internal::v1::PromptImage*> images;
  for (const auto& image : request.images()) images.push_back(&image);
  std::sort(images.begin(), images.end(),
            [](const auto* a, const auto* b) { return a->image_index() < b->image_index(); });
  std::vector<ContentHash> media;
  for (const auto* image : images) {
    media.push_back(ContentHash{image->content_hash().high(), image->content_hash().low()});
  }
  const scheduler::PrefixKeys p = request.has_chat()
                                      ? scheduler::ChatPrefixKeys(request.chat(), media)
                                      : scheduler::RawPrefixKeys(request.raw(), media);
  *covered = p.covered;
  return p.keys.empty() ? 0 : p.keys.back();
}

void PrefixDigest::Record(uint64_t key, uint32_t tokens) {
  recent_.erase(
      std::remove_if(recent_.begin(), recent_.end(), [&](const Entry& e) { return e.key == key; }),
      recent_.end());
  recent_.insert(recent_.begin(), {.key = key, .tokens = tokens});
  // The newest always stays; older ones while they fit.
  uint64_t sum = 0;
  size_t keep = 0;
  while (keep < recent_.size() && keep < options_.max_entries &&
         (keep == 0 || sum + recent_[keep].tokens <= options_.max_tokens)) {
    sum += recent_[keep++].tokens;
  }
  recent_.resize(keep);
  ++epoch_;
}

void PrefixDigest::Fill(internal::v1::LoadReport& report) const {
  report.set_prefix_epoch(epoch_);
  report.clear_cached_prefixes();
  for (const Entry& e : recent_) {
    internal::v1::CachedPrefix* p = report.add_cached_prefixes();
    p->set_key(e.key);
    p->set_tokens(e.tokens);
  }
}

}  // namespace mmserve::language
