// The messages of LanguageCore's loop (language_core.cc includes it; the
// role's calls come as Run). Everything in it is touched on the loop thread.
#ifndef MMSERVE_LANGUAGE_SERVICE_LANGUAGE_CORE_REQUEST_H_
#define MMSERVE_LANGUAGE_SERVICE_LANGUAGE_CORE_REQUEST_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "language_service/language_core.h"

namespace mmserve::language {

// What the loop thread is told, each handled in LanguageCore::Handle.
struct LanguageCore::Message {
  struct Install {  // Submit, ElasticPrefill or Decode, by the request's phase
    std::unique_ptr<LiveRequest> request;
  };
  struct Abort {
    std::string id;
    std::string reason;
  };
  struct Retry {
    v1::ImageRetry retry;
  };
  struct Run {  // RoleHost::RunOnLoop
    absl::AnyInvocable<void(bool shutting_down)> task;
  };
  struct ShutDown {};  // ends every request; the last message handled

  std::variant<Install, Abort, Retry, Run, ShutDown> body;
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_LANGUAGE_CORE_REQUEST_H_
