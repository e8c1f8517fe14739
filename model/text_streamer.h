// Turns a request's generated tokens into the text deltas a client sees:
// incremental detokenization plus stop strings. Text that could still turn
// into a stop string is held back; when one appears, the text before it is
// emitted and the stop string itself never is.
//
//   TextStreamer s(tokenizer, params);
//   for each token: ASSIGN_OR_RETURN(auto step, s.Push(id, num_generated));
//                   send(step.text); if (step.stopped) finish(step.matched_stop);
//   on EOS / length: send(s.Finish());
//
// Stop strings do not fire before `min_tokens` tokens were generated. One
// instance per request; not thread-safe.
#ifndef MMSERVE_MODEL_TEXT_STREAMER_H_
#define MMSERVE_MODEL_TEXT_STREAMER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/detokenizer.h"
#include "model/sampling.h"
#include "model/tokenizer.h"

namespace mmserve::model {

class TextStreamer {
 public:
  struct Step {
    std::string text;          // new text for the client (may be empty)
    bool stopped = false;      // a stop string matched: the request ends
    std::string matched_stop;  // which one
  };

  // `tokenizer` must outlive this object.
  TextStreamer(const Tokenizer& tokenizer, const SamplingParams& params)
      : detok_(tokenizer, params.skip_special_tokens),
        stop_(params.stop),
        min_tokens_(params.min_tokens) {}

  // Feeds the `num_generated`-th generated token (1-based).
  [[nodiscard]] absl::StatusOr<Step> Push(int32_t token, int num_generated);

  // The held-back text, once the request ended for another reason.
  std::string Finish();

 private:
  IncrementalDetokenizer detok_;
  std::vector<std::string> stop_;
  int min_tokens_;
  std::string held_;
  bool done_ = false;
};

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_TEXT_STREAMER_H_
