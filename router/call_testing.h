// Test support for router calls against in-process fake instances: a
// bounded wait, token batches, a fake service that reports itself healthy,
// and a sink that records what a call delivered. Test code only.
#ifndef MMSERVE_ROUTER_CALL_TESTING_H_
#define MMSERVE_ROUTER_CALL_TESTING_H_

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "proto/language.grpc.pb.h"
#include "router/router_context.h"

namespace mmserve::router {

using internal::v1::TokenBatch;

// Waits up to 10 s for `done`.
inline bool WaitFor(const std::function<bool()>& done) {
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

inline TokenBatch Tokens(uint32_t id, const std::string& text) {
  TokenBatch b;
  b.add_token_ids(id);
  b.set_text(text);
  return b;
}

inline TokenBatch Final(uint32_t id, const std::string& text) {
  TokenBatch b = Tokens(id, text);
  b.set_finish_reason(mmserve::v1::FINISH_REASON_LENGTH);
  b.mutable_usage()->set_completion_tokens(3);
  return b;
}

// A fake instance's service that reports it healthy to the poller.
template <typename Service>
class Healthy : public Service {
 public:
  explicit Healthy(std::string id) : id_(std::move(id)) {}
  grpc::Status GetLoad(grpc::ServerContext*, const internal::v1::LoadRequest*,
                       internal::v1::LoadReport* load) override {
    load->set_instance_id(id_);
    load->set_accepting(true);
    return grpc::Status::OK;
  }

 private:
  const std::string id_;
};

// What a call delivered to its sink.
class Outcome {
 public:
  CallSink Sink() {
    return {.on_response =
                [this](mmserve::v1::GenerateResponse r) {
                  absl::MutexLock lock(&mu_);
                  CHECK_FALSE(ended_.HasBeenNotified());
                  responses_.push_back(std::move(r));
                },
            .on_end =
                [this](absl::Status s) {
                  {
                    absl::MutexLock lock(&mu_);
                    status_ = std::move(s);
                  }
                  ended_.Notify();
                }};
  }
  bool WaitForEnd() { return ended_.WaitForNotificationWithTimeout(absl::Seconds(20)); }
  absl::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  std::vector<mmserve::v1::GenerateResponse> responses() {
    absl::MutexLock lock(&mu_);
    return responses_;
  }
  std::string Text() {
    std::string out;
    for (const auto& r : responses()) out += r.text();
    return out;
  }

 private:
  absl::Mutex mu_;
  std::vector<mmserve::v1::GenerateResponse> responses_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Notification ended_;
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_CALL_TESTING_H_
