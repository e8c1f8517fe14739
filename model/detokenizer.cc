#include "model/detokenizer.h"

#include "absl/strings/str_cat.h"
#include "model/byte_level.h"

namespace mmserve::model {

absl::StatusOr<std::string> IncrementalDetokenizer::Push(int32_t id) {
  if (skip_special_ && tokenizer_.IsSpecial(id)) return std::string();
  const size_t before = pending_.size();
  if (!tokenizer_.AppendTokenBytes(id, &pending_)) {
    pending_.resize(before);
    return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is not in the vocabulary"));
  }
  const size_t hold = IncompleteUtf8Suffix(pending_);
  std::string delta = Utf8Lossy(absl::string_view(pending_).substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  text_ += delta;
  return delta;
}

std::string IncrementalDetokenizer::Flush() {
  std::string delta = Utf8Lossy(pending_);
  pending_.clear();
  text_ += delta;
  return delta;
}

}  // namespace mmserve::model
