// A request's n choices (GenerateRequest.n > 1, OpenAI's n) run as n calls
// whose streams merge into the request's one sink. Choice 0 is the request
// itself; choices 1..n-1 start once choice 0's first token came (its
// prompt's KV is then in its instance's prefix cache, so the others do not
// prefill it again when placed there). With a seed s, choice i samples with
// seed s + i (vLLM's convention). Every response carries its choice's index
// and the request's id; each choice's final response has its own finish
// reason and usage. The sink's on_end runs once, after every started choice
// ended: OK when all did, else the first error (which cancels the others).
//
//   auto choices = ChoiceCalls::Start(request, sink, [&](GenerateRequest r, CallSink s) {
//     auto call = GenerateCall::Start(context, std::move(r), std::move(s), deadline);
//     return ChoiceCalls::StartedCall{call->id(),
//                                     [call](const std::string& why) { call->Cancel(why); }};
//   });
//   choices->CancelAll("client cancelled");   // any time
//
// Thread-safe. Nothing that reaches a call or the sink runs under mu_ (calls
// may run their sinks inline in the thread that starts or cancels them, and
// a sink may cancel inline); the sink's on_response may run on several
// threads at once (one per choice, each choice's responses in order), and
// its on_end waits for every delivery in flight.
#ifndef MMSERVE_ROUTER_CHOICE_CALLS_H_
#define MMSERVE_ROUTER_CHOICE_CALLS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "proto/inference.pb.h"
#include "router/router_context.h"

namespace mmserve::router {

class ChoiceCalls : public std::enable_shared_from_this<ChoiceCalls> {
 public:
  static constexpr uint32_t kMaxChoices = 16;
  // Cancels one started call.
  using Cancel = std::function<void(const std::string& reason)>;
  // A started call: its request id (the router's when the client gave none)
  // and how to cancel it.
  struct StartedCall {
    std::string id;
    Cancel cancel;
  };
  // Starts one choice's call (a request with n unset) on `sink`; may run the
  // sink inline.
  using StartCall = std::function<StartedCall(mmserve::v1::GenerateRequest, CallSink)>;

  // Starts choice 0. n above kMaxChoices ends the sink at once with
  // INVALID_ARGUMENT (nothing is started).
  static std::shared_ptr<ChoiceCalls> Start(mmserve::v1::GenerateRequest request, CallSink sink,
                                            StartCall start);
  ChoiceCalls(const ChoiceCalls&) = delete;
  ChoiceCalls& operator=(const ChoiceCalls&) = delete;

  // Cancels every started choice and starts no more.
  void CancelAll(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  // The request's id: choice 0's.
  std::string id() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ChoiceCalls(mmserve::v1::GenerateRequest request, CallSink sink, StartCall start);

  // Choice i's request: n unset, seed + i, token ids on (the first token of
  // choice 0 is what starts the others; they are dropped again when the
  // client did not ask for them).
  mmserve::v1::GenerateRequest ChoiceRequest(uint32_t i) const;
  void StartChoice(uint32_t i) ABSL_LOCKS_EXCLUDED(mu_);
  void StartRest() ABSL_LOCKS_EXCLUDED(mu_);
  void OnResponse(uint32_t i, mmserve::v1::GenerateResponse response) ABSL_LOCKS_EXCLUDED(mu_);
  void OnEnd(uint32_t i, absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  // The sink's on_end once every expected choice ended.
  void MaybeEnd() ABSL_LOCKS_EXCLUDED(mu_);

  const mmserve::v1::GenerateRequest request_;
  const uint32_t n_;
  const StartCall start_;

  mutable absl::Mutex mu_;
  std::string id_ ABSL_GUARDED_BY(mu_);               // the request's (choice 0's)
  std::vector<Cancel> cancels_ ABSL_GUARDED_BY(mu_);  // per choice, while started and not ended
  std::vector<bool> ended_choices_ ABSL_GUARDED_BY(mu_);
  uint32_t expected_ ABSL_GUARDED_BY(mu_) = 1;  // choices whose end is awaited
  uint32_t ended_ ABSL_GUARDED_BY(mu_) = 0;
  bool rest_started_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool end_sent_ ABSL_GUARDED_BY(mu_) = false;
  std::string cancel_reason_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);  // the first error
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;    // on_response calls running

  const CallSink sink_;
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_CHOICE_CALLS_H_
