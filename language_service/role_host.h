// What a role (role.h) reaches of the language core that runs it: the
// loop thread, the request table, the engine and the metrics. The core is
// the one implementation; a role gets it at Attach.
//
//   // a role's RPC, on a gRPC thread:
//   return host.Call<absl::Status>([&] { return CommitHere(commit); });
//   // on the loop thread:
//   if (LiveRequest* r = host.Find(id)) host.End(id, absl::DataLossError("..."));
//
// RunOnLoop, Call, MakeRequest and Install are thread-safe; every other
// method is the loop thread's, but for reading the engine's constant parts
// (config, sizing, tokenizer) through engine().
#ifndef MMSERVE_LANGUAGE_SERVICE_ROLE_HOST_H_
#define MMSERVE_LANGUAGE_SERVICE_ROLE_HOST_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/event_loop.h"
#include "language_service/language_metrics.h"
#include "language_service/request_table.h"
#include "worker/engine.h"

namespace mmserve::language {

class RoleHost {
 public:
  virtual ~RoleHost() = default;

  // Runs `task` on the loop thread (inline when called from it), with
  // whether the instance is shutting down; false (and `task` dropped) once
  // the loop stops.
  virtual bool RunOnLoop(absl::AnyInvocable<void(bool shutting_down)> task) = 0;
  // Runs `f` on the loop thread and waits for its answer; Unavailable when
  // the instance is shutting down.
  template <typename T, typename F>
  T Call(F f) {
    ReplyWaiter<T> waiter;
    const bool posted =
        RunOnLoop([f = std::move(f), reply = waiter.MakeReply()](bool shutting_down) mutable {
          reply.Send(shutting_down ? T(ShuttingDown()) : f());
        });
    if (!posted) return T(ShuttingDown());
    return waiter.Wait();
  }
  static absl::Status ShuttingDown() {
    return absl::UnavailableError("the language instance is shutting down");
  }

  // Submit's checks and the request they build, not yet installed.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<LiveRequest>> MakeRequest(
      const v1::PrefillRequest& request, RequestSink sink) = 0;
  // Claims the request's id and queues it for the loop (as Submit does).
  [[nodiscard]] virtual absl::Status Install(std::unique_ptr<LiveRequest> r) = 0;

  // Loop thread only, from here on.
  virtual LiveRequest* Find(const std::string& id) = 0;
  // Ends the request with `status` (its sink's on_end) and frees what it
  // holds; unknown ids are ignored.
  virtual void End(const std::string& id, absl::Status status) = 0;
  // The engine's events for a request (its tokens and finish).
  virtual void OnEvent(const worker::StreamEvent& e) = 0;
  // Refreshes the load report (for a role blocking the loop).
  virtual void UpdateLoad() = 0;
  virtual worker::LlmEngine& engine() = 0;
  virtual LanguageMetrics& metrics() = 0;
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_ROLE_HOST_H_
