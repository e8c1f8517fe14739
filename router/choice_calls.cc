#include "router/choice_calls.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mmserve::router {

ChoiceCalls::ChoiceCalls(mmserve::v1::GenerateRequest request, CallSink sink, StartCall start)
    : request_(std::move(request)),
      n_(std::max<uint32_t>(request_.n(), 1)),
      start_(std::move(start)),
      cancels_(n_),
      ended_choices_(n_),
      sink_(std::move(sink)) {}

std::shared_ptr<ChoiceCalls> ChoiceCalls::Start(mmserve::v1::GenerateRequest request, CallSink sink,
                                                StartCall start) {
  if (request.n() > kMaxChoices) {
    sink.on_end(absl::InvalidArgumentError(
        absl::StrCat("n must be in [1, ", kMaxChoices, "], got ", request.n())));
    return nullptr;
  }
  std::shared_ptr<ChoiceCalls> c(
      new ChoiceCalls(std::move(request), std::move(sink), std::move(start)));
  {
    absl::MutexLock lock(&c->mu_);
    c->id_ = c->request_.request_id();
  }
  c->StartChoice(0);
  return c;
}

mmserve::v1::GenerateRequest ChoiceCalls::ChoiceRequest(uint32_t i) const {
  mmserve::v1::GenerateRequest r = request_;
  r.clear_n();
  if (i > 0) r.clear_request_id();  // the router assigns each its own
  if (r.sampling().has_seed()) r.mutable_sampling()->set_seed(r.sampling().seed() + i);
  r.mutable_stream()->set_include_token_ids(true);
  return r;
}

void ChoiceCalls::StartChoice(uint32_t i) {
  std::shared_ptr<ChoiceCalls> self = shared_from_this();
  CallSink sink{
      .on_response = [self,
                      i](mmserve::v1::GenerateResponse r) { self->OnResponse(i, std::move(r)); },
      .on_end = [self, i](absl::Status s) { self->OnEnd(i, std::move(s)); }};
  StartedCall started = start_(ChoiceRequest(i), std::move(sink));
  Cancel cancel = std::move(started.cancel);
  std::string reason;
  {
    absl::MutexLock lock(&mu_);
    if (i == 0) id_ = started.id;
    if (!cancelled_) {
      if (!ended_choices_[i]) cancels_[i] = std::move(cancel);
      return;
    }
    reason = cancel_reason_;
  }
  cancel(reason);  // cancelled while it started
}

void ChoiceCalls::StartRest() {
  for (uint32_t i = 1; i < n_; ++i) {
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) {
        expected_ -= n_ - i;  // never started: no end to wait for
        break;
      }
    }
    StartChoice(i);
  }
  MaybeEnd();
}

std::string ChoiceCalls::id() const {
  absl::MutexLock lock(&mu_);
  return id_;
}

void ChoiceCalls::CancelAll(const std::string& reason) {
  std::vector<Cancel> started;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
    cancel_reason_ = reason;
    for (const Cancel& c : cancels_) {
      if (c) started.push_back(c);
    }
  }
  for (const Cancel& c : started) c(reason);
}

void ChoiceCalls::OnResponse(uint32_t i, mmserve::v1::GenerateResponse response) {
  bool start_rest = false;
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    if (end_sent_) return;
    ++in_flight_;
    if (i == 0 && id_.empty()) id_ = response.request_id();
    const bool first_token = response.token_ids_size() > 0 ||
                             response.finish_reason() != mmserve::v1::FINISH_REASON_UNSPECIFIED;
    if (i == 0 && first_token && !rest_started_ && !cancelled_) {
      rest_started_ = true;
      expected_ = n_;
      start_rest = true;
    }
    id = id_;
  }
  response.set_request_id(id);
  response.set_index(i);
  if (!request_.stream().include_token_ids()) response.clear_token_ids();
  sink_.on_response(std::move(response));
  {
    absl::MutexLock lock(&mu_);
    --in_flight_;
  }
  if (start_rest) {
    StartRest();  // ends with MaybeEnd
  } else {
    MaybeEnd();
  }
}

void ChoiceCalls::OnEnd(uint32_t i, absl::Status status) {
  std::vector<Cancel> others;
  Cancel own;
  std::string reason;
  {
    absl::MutexLock lock(&mu_);
    ++ended_;
    ended_choices_[i] = true;
    own = std::move(cancels_[i]);  // released outside mu_
    cancels_[i] = nullptr;
    if (i == 0 && !rest_started_) rest_started_ = true;  // ended before a token: no others
    if (!status.ok() && status_.ok()) {
      status_ = status;
      if (!cancelled_) {
        cancelled_ = true;
        cancel_reason_ = absl::StrCat("choice ", i, " failed: ", status.message());
        for (const Cancel& c : cancels_) {
          if (c) others.push_back(c);
        }
      }
    }
    reason = cancel_reason_;
  }
  for (const Cancel& c : others) c(reason);
  MaybeEnd();
}

void ChoiceCalls::MaybeEnd() {
  absl::Status status;
  std::vector<Cancel> leftover;
  {
    absl::MutexLock lock(&mu_);
    if (end_sent_ || !rest_started_ || ended_ < expected_ || in_flight_ > 0) return;
    end_sent_ = true;
    status = status_;
    for (Cancel& c : cancels_) {  // released outside mu_; the slots stay
      if (c) leftover.push_back(std::move(c));
      c = nullptr;
    }
  }
  sink_.on_end(std::move(status));
}

}  // namespace mmserve::router
