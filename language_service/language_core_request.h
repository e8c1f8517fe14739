// The connection records and loop messages of LanguageCore, shared by the
// files that implement it (language_core.cc: admission, the loop and the
// engine's events; language_core_images.cc: embeddings from encoders). Only
// those files include this header; everything in it is touched on the
// core's loop thread.
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

struct LanguageCore::Connection {
  std::string address;
  enum class State { kNone, kConnecting, kConnected } state = State::kNone;
  // (request id, image) waiting for the connection.
  std::vector<std::pair<std::string, size_t>> waiting;
};

// What the loop thread is told, each handled in LanguageCore::Handle.
struct LanguageCore::Message {
  struct Install {  // Submit, EspPrefill or Decode, by the request's phase
    std::unique_ptr<LiveRequest> request;
  };
  struct Abort {
    std::string id;
    std::string reason;
  };
  struct Retry {
    v1::ImageRetry retry;
  };
  struct Connected {
    std::string encoder;
    std::string address;
    absl::Status status;
  };
  struct ImageReceived {
    std::string id;
    size_t k = 0;
    std::string transfer_id;
    absl::StatusOr<transfer::ReceivedImage> image;
  };
  struct Run {  // RoleHost::RunOnLoop
    absl::AnyInvocable<void(bool shutting_down)> task;
  };
  struct ShutDown {};  // ends every request; the last message handled

  std::variant<Install, Abort, Retry, Connected, ImageReceived, Run, ShutDown> body;
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_LANGUAGE_CORE_REQUEST_H_
