// LanguageCore's calls of role elastic (issue 26): spans of a request's KV
// held for a group prefill.
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "language_service/language_core.h"
#include "language_service/language_core_request.h"

namespace mmserve::language {

absl::StatusOr<std::vector<int32_t>> LanguageCore::HoldSpan(const std::string& id, int tokens) {
  if (role_->kind() != LanguageRole::kElastic) {
    return absl::FailedPreconditionError("only role elastic holds spans of group prefills");
  }
  if (id.empty()) return absl::InvalidArgumentError("request_id is empty");
  using Answer = absl::StatusOr<std::vector<int32_t>>;
  return loop_->Call<Answer>([&id, tokens](Reply<Answer> reply) {
    return Message{Message::HoldSpan{id, tokens, std::move(reply)}};
  });
}

absl::StatusOr<std::vector<int32_t>> LanguageCore::HoldSpanHere(const std::string& id, int tokens) {
  if (requests_.count(id) != 0) {
    return absl::AlreadyExistsError("a request of that id lives here");
  }
  ASSIGN_OR_RETURN(std::vector<kvpool::BlockId> blocks, engine_->HoldSpan(id, tokens));
  std::vector<int32_t> ids;
  ids.reserve(blocks.size());
  for (kvpool::BlockId b : blocks) ids.push_back(b.value);
  return ids;
}

}  // namespace mmserve::language
