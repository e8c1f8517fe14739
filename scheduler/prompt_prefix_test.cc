#include "scheduler/prompt_prefix.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace mmserve::scheduler {
namespace {

void Add(mmserve::v1::Chat& chat, const std::string& role, const std::string& text,
         bool image = false) {
  mmserve::v1::ChatMessage* m = chat.add_messages();
  m->set_role(role);
  if (image) m->add_content()->mutable_image();
  m->add_content()->set_text(text);
}

const ContentHash kCat{1, 2};
const ContentHash kDog{3, 4};

TEST_CASE("a chat's next turn starts with the whole key of the turn before") {
  mmserve::v1::Chat first;
  Add(first, "system", "be brief");
  Add(first, "user", "what is this?", true);
  mmserve::v1::Chat second = first;
  Add(second, "assistant", "a cat");
  Add(second, "user", "what colour?");
  const PrefixKeys a = ChatPrefixKeys(first, {kCat});
  const PrefixKeys b = ChatPrefixKeys(second, {kCat});
  REQUIRE(a.keys.size() == 2);
  REQUIRE(b.keys.size() == 4);
  CHECK(b.keys[1] == a.keys.back());
  CHECK(a.covered == 1);
  // The same chat about another picture shares only what comes before it.
  const PrefixKeys dog = ChatPrefixKeys(second, {kDog});
  CHECK(dog.keys[0] == b.keys[0]);
  CHECK(dog.keys[1] != b.keys[1]);
  CHECK(dog.keys[3] != b.keys[3]);
}

TEST_CASE("roles, text boundaries and tools tell chats apart") {
  mmserve::v1::Chat a;
  Add(a, "user", "ab");
  Add(a, "user", "c");
  mmserve::v1::Chat b;
  Add(b, "user", "a");
  Add(b, "user", "bc");
  CHECK(ChatPrefixKeys(a, {}).keys[1] != ChatPrefixKeys(b, {}).keys[1]);
  mmserve::v1::Chat c;
  Add(c, "system", "ab");
  CHECK(ChatPrefixKeys(c, {}).keys[0] != ChatPrefixKeys(a, {}).keys[0]);
  mmserve::v1::Chat tools = a;
  tools.add_tools()->mutable_function()->set_name("lookup");
  CHECK(ChatPrefixKeys(tools, {}).keys[0] != ChatPrefixKeys(a, {}).keys[0]);
  // What only ends the prompt does not change its prefix.
  mmserve::v1::Chat no_generation = a;
  no_generation.set_add_generation_prompt(false);
  CHECK(ChatPrefixKeys(no_generation, {}).keys == ChatPrefixKeys(a, {}).keys);
}

TEST_CASE("a raw prompt is keyed per full chunk, its tail unkeyed") {
  mmserve::v1::RawPrompt raw;
  raw.set_text(std::string(kRawChunkBytes * 2 + kRawChunkBytes / 2, 'x'));
  const PrefixKeys p = RawPrefixKeys(raw, {});
  REQUIRE(p.keys.size() == 2);
  CHECK(p.covered == Approx(0.8));
  mmserve::v1::RawPrompt longer = raw;
  longer.set_text(raw.text() + std::string(kRawChunkBytes, 'y'));
  const PrefixKeys q = RawPrefixKeys(longer, {});
  REQUIRE(q.keys.size() == 3);
  CHECK(q.keys[1] == p.keys[1]);
  CHECK(RawPrefixKeys(raw, {kCat}).keys[0] != p.keys[0]);
  mmserve::v1::RawPrompt short_raw;
  short_raw.set_text("hi");
  CHECK(RawPrefixKeys(short_raw, {}).keys.empty());
  mmserve::v1::RawPrompt ids;
  for (uint32_t k = 0; k < kRawChunkIds; ++k) ids.add_token_ids(k);
  CHECK(RawPrefixKeys(ids, {}).keys.size() == 1);
  CHECK(RawPrefixKeys(ids, {}).covered == 1);
}

}  // namespace
}  // namespace mmserve::scheduler
