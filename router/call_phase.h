// The lifecycle of one Generate call at the router: one phase, changed only
// by NextPhase. Phases move forward only, in the order declared:
//
//   colocated:     kPlacing -> kPrefilling -> kDecoding -> kFinalHeld -> kEnded
//   disaggregated: kPlacing -> kPrefilling -> kDecoding -> kHandedOff -> kFinalHeld -> kEnded
//
// A first token that is also the last goes from kPrefilling to kFinalHeld;
// kEnd reaches kEnded from every other phase (an error or a cancel; OK only
// from kFinalHeld, which the caller guarantees). In the disaggregated call
// the hand-off batch carries the first token, so kDecoding lasts while that
// one batch is relayed. Like vLLM's RequestStatus, the order carries
// meaning: a phase after kPrefilling has streamed a token, and the images
// can no longer move to another encoder.
//
//   std::optional<CallPhase> next = NextPhase(phase, CallEvent::kFirstToken);
//   if (!next) ...;  // the event cannot happen in `phase`: a peer broke the protocol
//
// Pure functions; thread-safe.
#ifndef MMSERVE_ROUTER_CALL_PHASE_H_
#define MMSERVE_ROUTER_CALL_PHASE_H_

#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"

namespace mmserve::router {

enum class CallPhase : uint8_t {
  // Instances chosen, Encode calls started. Disaggregated: until the decode
  // instance holds the request (the empty first batch of its stream).
  kPlacing,
  // The Prefill stream is open and no token has arrived.
  kPrefilling,
  // Tokens stream on the Prefill stream (colocated: to the end).
  kDecoding,
  // Disaggregated: the KV is on the decode instance, whose stream carries the
  // rest; its batches that arrived before the hand-off have been relayed.
  kHandedOff,
  // The final response arrived. It is held until every Encode call has
  // answered (for usage.cached_images); the call ends once the stream that
  // carried it has closed OK too.
  kFinalHeld,
  // The sink's on_end is on its way; every event is ignored.
  kEnded,
};

enum class CallEvent : uint8_t {
  // The Prefill stream started: colocated at placement, disaggregated once
  // the decode instance holds the request.
  kPrefillStarted,
  // A batch with the first token (not the last).
  kFirstToken,
  // The Prefill stream's hand-off batch: the decode instance has the KV.
  kKvHandedOff,
  // A batch with a finish reason.
  kFinalResponse,
  // The call ends (OK, error or cancel).
  kEnd,
};

// The phase after `event` in `phase`; nullopt when `event` cannot happen in
// `phase` (the phase stays).
std::optional<CallPhase> NextPhase(CallPhase phase, CallEvent event);

absl::string_view PhaseName(CallPhase phase);
absl::string_view EventName(CallEvent event);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_CALL_PHASE_H_
