// A tensor-parallel prefill instance (two rank processes, each holding 2 of
// the model's 4 KV heads) hands its KV to decode instances of TP 2 (rank r
// -> rank r), 1 (both ranks into the one rank) and 4 (each prefill rank into
// two decode ranks): role both's tokens and text, whole and layer-wise, the
// KV bytes the decode side received are the ones sent, nothing leaks.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "language_service/kv_bytes_moved.h"
#include "language_service/roles_testing.h"

namespace mmserve::language {
namespace {

using namespace testing;  // NOLINT: the roles test support

const std::vector<std::string>& Prompts() {
  static const std::vector<std::string> prompts = {
      "The quick brown fox jumps over the lazy dog",
      "Hi",
      "A much longer prompt that spans several KV blocks of four tokens each, so that the "
      "hand-off moves more than a handful of blocks and every layer's keys and values",
  };
  return prompts;
}

// Into each decode TP size in turn: role both's tokens, and the bytes each
// decode instance received are those the prefill instance sent it.
void IntoEachDecodeTp(Instance& both, Instance& prefill, const std::string& name) {
  for (int decode_tp : {2, 1, 4}) {
    INFO(name << " -> decode TP " << decode_tp);
    const transfer::WireBytes sent = KvBytesMoved(prefill.registry, "handoff");
    const double before = sent.sent->value();
    Instance decode(LanguageRole::kDecode, absl::Seconds(10), decode_tp,
                    {.id = absl::StrCat("decode-tp", decode_tp)});
    SplitEqualsBoth(both, prefill, decode, Prompts(),
                    {.id_prefix = absl::StrCat(name, "-", decode_tp, "-"), .max_tokens = 8});
    const transfer::WireBytes received = KvBytesMoved(decode.registry, "handoff");
    CHECK(sent.sent->value() > before);
    CHECK(received.received->value() == sent.sent->value() - before);
    CHECK(decode.Idle());
    CHECK(prefill.Idle());
  }
}

TEST_CASE("a TP=2 prefill instance gives role both's tokens into decode TP 2, 1 and 4",
          "[roles][tp]") {
  Instance both(LanguageRole::kBoth);
  {
    Instance whole(
        LanguageRole::kPrefill, absl::Seconds(10), 2,
        {.id = "prefill-tp2", .adjust_role = [](RoleOptions& o) { o.handoff_layer_group = 0; }});
    IntoEachDecodeTp(both, whole, "whole");
  }
  {
    Instance layers(LanguageRole::kPrefill, absl::Seconds(10), 2,
                    {.id = "prefill-tp2-layers", .adjust_role = [](RoleOptions& o) {
                       o.handoff_layer_group = 1;
                       o.handoff_layerwise_min_tokens = 0;
                     }});
    IntoEachDecodeTp(both, layers, "layers");
  }
  CHECK(both.Idle());
}

}  // namespace
}  // namespace mmserve::language
