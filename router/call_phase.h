// The lifecycle of one Generate call at the router: one phase, changed only
// by NextPhase. A call relays an ordered chain of token streams, the
// carriers (placer.h): one carries the tokens at a time, and each hands
// over to the next (kCarrierMoved). Phases move forward only, in the order
// declared, except that kHandedOver repeats for every later move:
//
//   colocated [prefill]:     kPlacing -> kPrefilling -> kDecoding -> kFinalHeld -> kEnded
//   P/D [prefill -> decode]: kPlacing -> kPrefilling -> kDecoding -> kHandedOver
//                            -> kFinalHeld -> kEnded
//   elastic [sampler -> master0 -> master1 ...]:
//                            kPlacing -> kPrefilling -> kDecoding -> kHandedOver
//                            (-> kHandedOver per master move) -> kFinalHeld -> kEnded
//
// A first token that is also the last goes from kPrefilling to kFinalHeld;
// kEnd reaches kEnded from every other phase (an error or a cancel; OK only
// from kFinalHeld, which the caller guarantees). In P/D the hand-off batch
// carries the first token, so kDecoding lasts while that one batch is
// relayed; an elastic group whose sampler is its first master has no
// sampler link, and goes to kHandedOver only at its first master move.
// Like vLLM's RequestStatus, the order carries meaning: a phase after
// kPrefilling has streamed a token, and the images can no longer move to
// another encoder.
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
  // Waiting for a placement (elastic: queued), then Encode calls started.
  // P/D: until the decode instance holds the request (the empty first batch
  // of its stream).
  kPlacing,
  // The language streams are open and no token has arrived.
  kPrefilling,
  // Tokens stream on the first carrier (colocated: to the end).
  kDecoding,
  // A later carrier carries the tokens (P/D: the decode instance has the
  // KV; elastic: a master took over); the batches it sent before the move
  // have been relayed.
  kHandedOver,
  // The final response arrived. It is held until every Encode call has
  // answered (for usage.cached_images); the call ends once the stream that
  // carried it has closed OK too.
  kFinalHeld,
  // The sink's on_end is on its way; every event is ignored.
  kEnded,
};

enum class CallEvent : uint8_t {
  // The language streams started: at placement, P/D once the decode
  // instance holds the request.
  kPrefillStarted,
  // A batch with the first token (not the last).
  kFirstToken,
  // The carrier handed over to the next one (P/D: the prefill stream's
  // hand-off batch; elastic: the sampler's first token or a master move).
  kCarrierMoved,
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
