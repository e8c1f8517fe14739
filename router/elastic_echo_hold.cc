#include "router/elastic_echo_hold.h"

#include "transfer/elastic_echo.h"

namespace mmserve::router {

ElasticEchoHold::Next ElasticEchoHold::OnClosed(size_t member, const grpc::Status& status,
                                                const std::vector<std::function<void()>>& open) {
  bool others_open = false;
  for (size_t m = 0; m < open.size(); ++m) others_open |= m != member && open[m] != nullptr;
  const bool echo = !status.ok() && transfer::IsElasticEcho(status.error_message());
  const bool holding = !held_.ok();
  if (!echo) {
    // A reason decides; an OK end that leaves only a held echo ends with it.
    return status.ok() && holding && !others_open ? Next::kEndHeld : Next::kAsUsual;
  }
  if (!others_open) return holding ? Next::kEndHeld : Next::kAsUsual;
  if (!holding) {
    held_ = status;
    held_member_ = member;
  }
  return Next::kHold;
}

}  // namespace mmserve::router
