// Streaming detokenization of arbitrary token sequences (model/testdata's
// Qwen2-style tokenizer, whose byte-level tokens split UTF-8 characters
// freely). Properties:
//  - IncrementalDetokenizer: every delta is valid UTF-8 (it never splits a
//    character), and the deltas plus Flush() equal a one-shot Decode;
//  - TextStreamer with stop strings (valid UTF-8, as the API delivers them):
//    every step's text is valid UTF-8; without a stop the output equals the
//    one-shot decode; with one, output + stop string is a prefix of it and
//    the stop string never appears in the output (with min_tokens 0).
// Input: a few stop strings, then the token ids, two bytes each.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_check.h"
#include "model/detokenizer.h"
#include "model/sampling.h"
#include "model/text_streamer.h"
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

// A stop string the API could carry: the valid UTF-8 prefix of `len` input
// bytes, non-empty.
bool TakeStop(const uint8_t*& data, size_t& size, std::string* stop) {
  if (size == 0) return false;
  const size_t len = data[0] % 8;
  ++data;
  --size;
  const size_t n = len < size ? len : size;
  absl::string_view raw(reinterpret_cast<const char*>(data), n);
  data += n;
  size -= n;
  *stop = std::string(raw.substr(0, ValidUtf8Prefix(raw)));
  return !stop->empty();
}

}  // namespace
}  // namespace mmserve::model

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mmserve::model;
  if (size < 2 || size > 8192) return 0;
  const Tokenizer& tok = Tok();
  const bool skip_special = data[0] & 1;
  const int num_stops = (data[0] >> 1) % 4;
  const int min_tokens = data[1] % 8;
  data += 2;
  size -= 2;
  SamplingParams params;
  params.skip_special_tokens = skip_special;
  params.min_tokens = min_tokens;
  for (int i = 0; i < num_stops; ++i) {
    std::string stop;
    if (TakeStop(data, size, &stop)) params.stop.push_back(stop);
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < size; i += 2) {
    // Mostly inside the vocabulary; now and then an id just past it.
    ids.push_back(((data[i] << 8) | data[i + 1]) % (tok.vocab_size() + 4));
  }
  std::vector<int32_t> valid_ids;
  IncrementalDetokenizer detok(tok, skip_special);
  std::string streamed;
  for (int32_t id : ids) {
    absl::StatusOr<std::string> delta = detok.Push(id);
    if (!delta.ok()) {
      FUZZ_CHECK(tok.IdToToken(id).empty()) << id << ": " << delta.status();
      continue;  // state unchanged; the id is left out
    }
    valid_ids.push_back(id);
    FUZZ_CHECK(ValidUtf8(*delta)) << "delta splits a character after id " << id;
    streamed += *delta;
  }
  const std::string tail = detok.Flush();
  FUZZ_CHECK(ValidUtf8(tail));
  streamed += tail;
  absl::StatusOr<std::string> whole = tok.Decode(valid_ids, skip_special);
  FUZZ_CHECK(whole.ok()) << whole.status();
  FUZZ_CHECK(streamed == *whole) << "streamed " << streamed.size() << " bytes, one-shot "
                                 << whole->size();
  FUZZ_CHECK(detok.text() == streamed);

  TextStreamer streamer(tok, params);
  std::string out;
  bool stopped = false;
  std::string matched;
  int n = 0;
  for (int32_t id : valid_ids) {
    absl::StatusOr<TextStreamer::Step> step = streamer.Push(id, ++n);
    FUZZ_CHECK(step.ok()) << step.status();
    FUZZ_CHECK(ValidUtf8(step->text)) << "step text splits a character";
    FUZZ_CHECK(!stopped || step->text.empty()) << "text after the stop";
    out += step->text;
    if (step->stopped && !stopped) {
      stopped = true;
      matched = step->matched_stop;
    }
  }
  const std::string rest = streamer.Finish();
  FUZZ_CHECK(ValidUtf8(rest));
  out += rest;
  if (!stopped) {
    FUZZ_CHECK(out == *whole) << "streamer lost or added text: " << out.size() << " vs "
                              << whole->size();
  } else {
    FUZZ_CHECK(rest.empty());
    FUZZ_CHECK(whole->compare(0, out.size() + matched.size(), out + matched) == 0)
        << "output + stop string is not a prefix of the decode";
    for (const std::string& s : params.stop) {
      if (min_tokens > 0) break;  // stops may pass unmatched before min_tokens
      FUZZ_CHECK(out.find(s) == std::string::npos) << "a stop string leaked into the output";
    }
  }
  return 0;
}
