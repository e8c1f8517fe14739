// Actions collected while a caller's mutex is held and run once it is
// released. gRPC may run reactions inline in the thread that starts or
// cancels a call, so a GenerateCall never reaches gRPC or its sink under its
// own mutex: it defers those actions and each entry point runs them after
// unlocking.
//
//   { absl::MutexLock lock(&mu_); deferred_.Defer([s] { s->Cancel(); }); }
//   deferred_.Run();
//
// One thread at a time runs the actions, in the order they were deferred
// (with prefill/decode roles two streams deliver batches on different
// threads, and their responses must reach the sink in order); a Run that
// finds another thread running returns at once, and that thread runs the
// new actions too, including those the actions themselves defer.
// Thread-safe. Lock order: the caller's mutex, then this one; Run must not
// be called with the caller's mutex held.
#ifndef MMSERVE_ROUTER_DEFERRED_ACTIONS_H_
#define MMSERVE_ROUTER_DEFERRED_ACTIONS_H_

#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace mmserve::router {

class DeferredActions {
 public:
  void Defer(std::function<void()> action) ABSL_LOCKS_EXCLUDED(mu_);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  std::vector<std::function<void()>> actions_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_DEFERRED_ACTIONS_H_
