#include "language_service/request_table.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mmserve::language {

void Advance(LiveRequest& r, RequestEvent event) {
  using P = RequestPhase;
  const P from = r.phase;
  P to = from;
  switch (event) {
    case RequestEvent::kImagesArrived:
      if (from == P::kGathering) to = P::kInEngine;
      break;
    case RequestEvent::kKvReserved:
      if (from == P::kRegistered) to = P::kAwaitingKv;
      break;
    case RequestEvent::kKvCommitted:
      if (from == P::kAwaitingKv) to = P::kInEngine;
      break;
    case RequestEvent::kPromptDone:
      if (from == P::kInEngine) to = P::kHandingOff;
      break;
    case RequestEvent::kAbortAsked:
      if (from == P::kAwaitingKv || from == P::kInEngine) to = P::kAborting;
      break;
  }
  CHECK(to != from) << "request " << r.id << ": event " << static_cast<int>(event) << " in phase "
                    << RequestPhaseName(from);
  r.phase = to;
}

const char* RequestPhaseName(RequestPhase p) {
  switch (p) {
    case RequestPhase::kGathering:
      return "gathering";
    case RequestPhase::kRegistered:
      return "registered";
    case RequestPhase::kAwaitingKv:
      return "awaiting_kv";
    case RequestPhase::kInEngine:
      return "in_engine";
    case RequestPhase::kHandingOff:
      return "handing_off";
    case RequestPhase::kAborting:
      return "aborting";
  }
  return "?";
}

absl::Status RequestTable::Claim(const std::string& id, absl::FunctionRef<bool()> post) {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("the language instance is shutting down");
  if (!ids_.insert(id).second) {
    return absl::AlreadyExistsError(absl::StrCat("request ", id, " is already running"));
  }
  if (!post()) {
    ids_.erase(id);
    return absl::UnavailableError("the language instance is shutting down");
  }
  return absl::OkStatus();
}

bool RequestTable::RunUnlessKnown(const std::string& id, absl::FunctionRef<void()> f) {
  absl::MutexLock lock(&mu_);
  if (ids_.count(id) != 0) return false;
  f();
  return true;
}

size_t RequestTable::size() const {
  absl::MutexLock lock(&mu_);
  return ids_.size();
}

bool RequestTable::Close() {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  closed_ = true;
  return true;
}

void RequestTable::Insert(std::unique_ptr<LiveRequest> r) {
  const std::string id = r->id;
  records_[id] = std::move(r);
}

LiveRequest* RequestTable::Find(const std::string& id) {
  auto it = records_.find(id);
  return it == records_.end() ? nullptr : it->second.get();
}

std::unique_ptr<LiveRequest> RequestTable::Take(const std::string& id) {
  auto it = records_.find(id);
  if (it == records_.end()) return nullptr;
  std::unique_ptr<LiveRequest> r = std::move(it->second);
  records_.erase(it);
  absl::MutexLock lock(&mu_);
  ids_.erase(id);
  return r;
}

std::vector<std::string> RequestTable::Ids(
    const std::function<bool(const LiveRequest&)>& keep) const {
  std::vector<std::string> ids;
  for (const auto& [id, r] : records_) {
    if (keep(*r)) ids.push_back(id);
  }
  return ids;
}

}  // namespace mmserve::language
