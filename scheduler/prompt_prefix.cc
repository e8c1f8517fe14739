#include "scheduler/prompt_prefix.h"

#include <string>

#include "absl/strings/string_view.h"

namespace mmserve::scheduler {
namespace {

constexpr uint64_t kChatRoot = 0x63686174726f6f74ULL;  // "chatroot"
constexpr uint64_t kRawRoot = 0x726177726f6f7421ULL;   // "rawroot!"

// Mixes a string in, its length first (so "ab"+"c" differs from "a"+"bc").
uint64_t Mix(uint64_t h, absl::string_view s) {
  return HashCombine(HashCombine(h, s.size()), Hash64(s.data(), s.size()));
}

uint64_t Mix(uint64_t h, const ContentHash& c) {
  return HashCombine(HashCombine(h, c.high), c.low);
}

// The media hash at `next` (zero past the end), and `next` moves on.
ContentHash NextMedia(absl::Span<const ContentHash> media, size_t& next) {
  return next < media.size() ? media[next++] : (++next, ContentHash{});
}

// What renders before the messages: the tools and the thinking switch.
uint64_t ChatRoot(const mmserve::v1::Chat& chat) {
  uint64_t h = HashCombine(kChatRoot, chat.tools_size());
  for (const mmserve::v1::Tool& tool : chat.tools()) {
    std::string bytes;
    tool.SerializeToString(&bytes);
    h = Mix(h, bytes);
  }
  return HashCombine(h, chat.has_enable_thinking() ? 1 + chat.enable_thinking() : 0);
}

uint64_t MixMessage(uint64_t h, const mmserve::v1::ChatMessage& m,
                    absl::Span<const ContentHash> media, size_t& next) {
  h = Mix(h, m.role());
  for (const mmserve::v1::ContentPart& p : m.content()) {
    h = HashCombine(h, static_cast<uint64_t>(p.part_case()));
    if (p.has_image() || p.has_video()) {
      h = Mix(h, NextMedia(media, next));
    } else {
      h = Mix(h, p.text());
    }
  }
  for (const mmserve::v1::ToolCall& call : m.tool_calls()) {
    h = Mix(Mix(Mix(h, call.id()), call.name()), call.arguments());
  }
  h = Mix(h, m.tool_call_id());
  return m.has_reasoning_content() ? Mix(h, m.reasoning_content()) : HashCombine(h, 0);
}

}  // namespace

PrefixKeys ChatPrefixKeys(const mmserve::v1::Chat& chat, absl::Span<const ContentHash> media) {
  PrefixKeys p;
  uint64_t h = ChatRoot(chat);
  size_t next = 0;
  for (const mmserve::v1::ChatMessage& m : chat.messages()) {
    h = MixMessage(h, m, media, next);
    p.keys.push_back(h);
  }
  p.covered = p.keys.empty() ? 0 : 1;
  return p;
}

PrefixKeys RawPrefixKeys(const mmserve::v1::RawPrompt& raw, absl::Span<const ContentHash> media) {
  uint64_t h = HashCombine(kRawRoot, media.size());
  for (const ContentHash& c : media) h = Mix(h, c);
  PrefixKeys p;
  const size_t ids = static_cast<size_t>(raw.token_ids_size());
  if (ids > 0) {
    for (size_t begin = 0; begin + kRawChunkIds <= ids; begin += kRawChunkIds) {
      h = HashCombine(h, Hash64(raw.token_ids().data() + begin, kRawChunkIds * sizeof(uint32_t)));
      p.keys.push_back(h);
    }
    p.covered = static_cast<double>(p.keys.size() * kRawChunkIds) / ids;
    return p;
  }
  const absl::string_view text = raw.text();
  for (size_t begin = 0; begin + kRawChunkBytes <= text.size(); begin += kRawChunkBytes) {
    h = Mix(h, text.substr(begin, kRawChunkBytes));
    p.keys.push_back(h);
  }
  if (!text.empty()) p.covered = static_cast<double>(p.keys.size() * kRawChunkBytes) / text.size();
  return p;
}

}  // namespace mmserve::scheduler
