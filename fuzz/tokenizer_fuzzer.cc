// Arbitrary text through the tokenizer (model/testdata's Qwen2-style
// tokenizer.json: NFC, the Qwen2 split pre-tokenizer, byte-level BPE, added
// tokens). Properties:
//  - every id Encode returns is inside the vocabulary;
//  - valid UTF-8: Decode(Encode(text)) == NFC(text), with and without
//    special-token parsing (this tokenizer has no lstrip/rstrip tokens);
//  - invalid UTF-8: Encode succeeds or fails cleanly (InvalidArgument), and
//    whatever ids come back decode to valid UTF-8;
//  - Decode of arbitrary ids is valid UTF-8 or InvalidArgument for an id
//    outside the vocabulary.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_check.h"
#include "model/tokenizer.h"
#include "model/unicode.h"

namespace mmserve::model {
namespace {

const Tokenizer& Tok() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::FromFile("model/testdata/tokenizer/tokenizer.json");
    FUZZ_CHECK(t.ok()) << t.status() << " (run from the workspace root)";
    return t->release();
  }();
  return *tok;
}

bool ValidUtf8(absl::string_view s) { return ValidUtf8Prefix(s) == s.size(); }

std::string Hex(absl::string_view s) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

void CheckIds(const Tokenizer& tok, const std::vector<int32_t>& ids, absl::string_view text) {
  for (int32_t id : ids) {
    FUZZ_CHECK(id >= 0 && id < tok.vocab_size()) << id << " for " << Hex(text);
  }
}

}  // namespace
}  // namespace mmserve::model

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mmserve::model;
  if (size > 4096) return 0;  // BPE cost grows with word length; keep runs fast
  const Tokenizer& tok = Tok();
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const bool valid = ValidUtf8(text);
  for (bool parse_special : {false, true}) {
    absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text, parse_special);
    if (!ids.ok()) {
      FUZZ_CHECK(!valid) << "valid UTF-8 failed to encode: " << ids.status() << " " << Hex(text);
      FUZZ_CHECK(absl::IsInvalidArgument(ids.status())) << ids.status();
      continue;
    }
    CheckIds(tok, *ids, text);
    absl::StatusOr<std::string> back = tok.Decode(*ids, /*skip_special=*/false);
    FUZZ_CHECK(back.ok()) << back.status();
    FUZZ_CHECK(ValidUtf8(*back)) << Hex(*back);
    if (valid) {
      const std::string want = NormalizeNfc(text);
      FUZZ_CHECK(*back == want) << "round trip (parse_special=" << parse_special << ") of "
                                << Hex(text) << " gave " << Hex(*back) << ", want " << Hex(want);
    }
  }
  // The same bytes as token ids (two bytes each, some past the vocabulary).
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < size; i += 2) ids.push_back((data[i] << 8 | data[i + 1]) % 2200);
  for (bool skip : {false, true}) {
    absl::StatusOr<std::string> decoded = tok.Decode(ids, skip);
    bool in_vocab = true;
    for (int32_t id : ids) in_vocab &= (skip && tok.IsSpecial(id)) || !tok.IdToToken(id).empty();
    FUZZ_CHECK(decoded.ok() == in_vocab) << decoded.status();
    if (decoded.ok()) FUZZ_CHECK(ValidUtf8(*decoded)) << Hex(*decoded);
  }
  return 0;
}
