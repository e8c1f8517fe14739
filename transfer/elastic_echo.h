// The echo of an elastic group's abort. A member that gives up (it refuses
// its request, its rows fail) puts an abort word with its code on every
// peer's board (UcxElasticExchange::Abort); each peer then stops at once
// and ends with that code and the message below, not with the reason,
// which only the member that gave up reports. Whoever reads the members'
// ends (the router) prefers an end that is not an echo.
//
//   if (IsElasticEcho(status.message())) { /* another member has the reason */ }
//
// Thread-safe (constants and a pure function).
#ifndef MMSERVE_TRANSFER_ELASTIC_ECHO_H_
#define MMSERVE_TRANSFER_ELASTIC_ECHO_H_

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace mmserve::transfer {

// What a wait on a board ends with when an abort word comes in; the
// exchange puts its context before it ("elastic exchange: ...").
inline constexpr absl::string_view kElasticEcho = "a peer gave up";

// Whether an end's message is an echo of another member's abort.
inline bool IsElasticEcho(absl::string_view message) {
  return absl::EndsWith(message, kElasticEcho);
}

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_ELASTIC_ECHO_H_
