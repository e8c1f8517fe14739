// Prefix keys of a prompt that the router and the language instance both
// compute without tokenizing: the router places a request where an earlier
// prompt it extends was computed (docs/routing.md), the instance reports
// the keys of the prompts it computed (LoadReport.cached_prefixes).
//
//   PrefixKeys p = ChatPrefixKeys(request.chat(), media_hashes);
//   // p.keys[i]: the prompt through message i (chat) or full chunk i (raw);
//   // p.keys.back() covers p.covered of the prompt.
//
// A chat's key i covers what renders the chat up to the end of message i:
// the tools and the thinking switch (rendered first), then each message's
// role, text, tool calls and reasoning, and the content hash of each image
// or video in it. A chat's second turn (its first turn's messages, the
// reply, a new question) therefore starts with the first turn's whole
// key. A raw prompt is keyed per full kRawChunkBytes of text (or
// kRawChunkIds token ids), its media hashes folded into every key: a tail
// shorter than a chunk has no key.
//
// Pure functions; thread-safe.
#ifndef MMSERVE_SCHEDULER_PROMPT_PREFIX_H_
#define MMSERVE_SCHEDULER_PROMPT_PREFIX_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/hash.h"
#include "proto/inference.pb.h"

namespace mmserve::scheduler {

inline constexpr size_t kRawChunkBytes = 256;
inline constexpr size_t kRawChunkIds = 64;

struct PrefixKeys {
  std::vector<uint64_t> keys;
  // The share of the prompt (text bytes or ids) the last key covers: 1 for
  // a chat.
  double covered = 0;
};

// `media`: the content hash of every image and video of the prompt, in
// order of appearance (a missing one counts as zero).
PrefixKeys ChatPrefixKeys(const mmserve::v1::Chat& chat, absl::Span<const ContentHash> media);
PrefixKeys RawPrefixKeys(const mmserve::v1::RawPrompt& raw, absl::Span<const ContentHash> media);

}  // namespace mmserve::scheduler

#endif  // MMSERVE_SCHEDULER_PROMPT_PREFIX_H_
