#include "model/text_streamer.h"

#include <algorithm>

#include "common/status_macros.h"

namespace mmserve::model {

absl::StatusOr<TextStreamer::Step> TextStreamer::Push(int32_t token, int num_generated) {
  Step step;
  if (done_) return step;
  ASSIGN_OR_RETURN(std::string delta, detok_.Push(token));
  held_ += delta;
  if (stop_.empty()) {
    step.text.swap(held_);
    return step;
  }
  if (num_generated >= min_tokens_) {
    // The earliest stop string wins; ties go to the one listed first.
    size_t best = std::string::npos;
    const std::string* matched = nullptr;
    for (const std::string& s : stop_) {
      size_t at = held_.find(s);
      if (at < best) {
        best = at;
        matched = &s;
      }
    }
    if (matched != nullptr) {
      step.text = held_.substr(0, best);
      step.stopped = true;
      step.matched_stop = *matched;
      held_.clear();
      done_ = true;
      return step;
    }
  }
  // Hold the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stop_) {
    for (size_t n = std::min(s.size() - 1, held_.size()); n > hold; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  step.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return step;
}

std::string TextStreamer::Finish() {
  if (done_) return "";
  done_ = true;
  std::string rest = held_ + detok_.Flush();
  held_.clear();
  return rest;
}

}  // namespace mmserve::model
