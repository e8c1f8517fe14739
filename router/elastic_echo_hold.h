// Which member's end an elastic group's call ends with. When one member
// gives up during the group prefill (it refuses the request, its rows
// fail), the others stop at once and end with its code and an echo
// (transfer/elastic_echo.h) instead of its reason. Whichever end reaches
// the router first would decide what the client reads: an echo ("a peer
// gave up") where the refusal said what was wrong. So an echo is held
// while another member's stream is still open; the first end that is not
// an echo decides, and the first echo only once no other stream can end
// with the reason.
//
//   switch (hold.OnClosed(member, status, open)) {
//     case ElasticEchoHold::Next::kHold: return;     // another end may say why
//     case ElasticEchoHold::Next::kEndHeld:          // held_member() ended with held()
//       Failed(hold.held_member(), hold.held()); return;
//     case ElasticEchoHold::Next::kAsUsual: break;   // `status` decides
//   }
//
// Not thread-safe: the call guards it with its lock.
#ifndef MMSERVE_ROUTER_ELASTIC_ECHO_HOLD_H_
#define MMSERVE_ROUTER_ELASTIC_ECHO_HOLD_H_

#include <grpcpp/support/status.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace mmserve::router {

class ElasticEchoHold {
 public:
  enum class Next : uint8_t {
    kAsUsual,  // handle the end as any stream's
    kHold,     // an echo, kept: another stream is open
    kEndHeld,  // nothing more can come: end the call with held()
  };
  // Member `member`'s stream ended with `status`; `open[m]` (a stream's
  // cancel) is set while member m's stream has not ended.
  Next OnClosed(size_t member, const grpc::Status& status,
                const std::vector<std::function<void()>>& open);
  // The first echo held (OK when none), and whose end it was.
  const grpc::Status& held() const { return held_; }
  size_t held_member() const { return held_member_; }

 private:
  grpc::Status held_;
  size_t held_member_ = 0;
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_ELASTIC_ECHO_HOLD_H_
