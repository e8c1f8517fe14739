// Streaming detokenization: turns generated token ids into text deltas that
// never split a UTF-8 character. Bytes of an incomplete character are held
// until the token that completes it arrives; bytes that can never become
// valid UTF-8 are emitted as U+FFFD, as a full decode would show them. The
// concatenated deltas plus Flush() equal Tokenizer::Decode of all the ids.
//
//   IncrementalDetokenizer detok(tokenizer, /*skip_special=*/true);
//   for (int32_t id : generated) {
//     ASSIGN_OR_RETURN(std::string delta, detok.Push(id));
//     stream(delta);  // may be empty
//   }
//   stream(detok.Flush());
//
// One instance per request; not thread-safe.
#ifndef MMSERVE_MODEL_DETOKENIZER_H_
#define MMSERVE_MODEL_DETOKENIZER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "model/tokenizer.h"

namespace mmserve::model {

class IncrementalDetokenizer {
 public:
  // `tokenizer` must outlive this object.
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}

  // The text that became complete with token `id`. InvalidArgument for an id
  // outside the vocabulary (state unchanged).
  [[nodiscard]] absl::StatusOr<std::string> Push(int32_t id);

  // Whatever is still held back, with U+FFFD for an unfinished character.
  std::string Flush();

  // All text emitted so far (stop-string matching looks at its tail).
  const std::string& text() const { return text_; }

 private:
  const Tokenizer& tokenizer_;
  const bool skip_special_;
  std::string pending_;  // bytes not yet emitted
  std::string text_;
};

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_DETOKENIZER_H_
