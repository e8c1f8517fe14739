#include "router/deferred_actions.h"

#include <utility>

namespace mmserve::router {

void DeferredActions::Defer(std::function<void()> action) {
  absl::MutexLock lock(&mu_);
  actions_.push_back(std::move(action));
}

void DeferredActions::Run() {
  {
    absl::MutexLock lock(&mu_);
    if (running_) return;  // that thread runs ours too
    running_ = true;
  }
  for (;;) {
    std::vector<std::function<void()>> actions;
    {
      absl::MutexLock lock(&mu_);
      actions.swap(actions_);
      if (actions.empty()) {
        running_ = false;
        return;
      }
    }
    for (auto& a : actions) a();
  }
}

}  // namespace mmserve::router
