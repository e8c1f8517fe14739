#include "router/call_phase.h"

namespace mmserve::router {

std::optional<CallPhase> NextPhase(CallPhase phase, CallEvent event) {
  using P = CallPhase;
  switch (event) {
    case CallEvent::kPrefillStarted:
      if (phase == P::kPlacing) return P::kPrefilling;
      break;
    case CallEvent::kFirstToken:
      if (phase == P::kPrefilling) return P::kDecoding;
      break;
    case CallEvent::kCarrierMoved:
      if (phase == P::kPrefilling || phase == P::kDecoding || phase == P::kHandedOver) {
        return P::kHandedOver;
      }
      break;
    case CallEvent::kFinalResponse:
      if (phase == P::kPrefilling || phase == P::kDecoding || phase == P::kHandedOver) {
        return P::kFinalHeld;
      }
      break;
    case CallEvent::kEnd:
      if (phase != P::kEnded) return P::kEnded;
      break;
  }
  return std::nullopt;
}

absl::string_view PhaseName(CallPhase phase) {
  switch (phase) {
    case CallPhase::kPlacing:
      return "placing";
    case CallPhase::kPrefilling:
      return "prefilling";
    case CallPhase::kDecoding:
      return "decoding";
    case CallPhase::kHandedOver:
      return "handed over";
    case CallPhase::kFinalHeld:
      return "final held";
    case CallPhase::kEnded:
      return "ended";
  }
  return "?";
}

absl::string_view EventName(CallEvent event) {
  switch (event) {
    case CallEvent::kPrefillStarted:
      return "prefill started";
    case CallEvent::kFirstToken:
      return "first token";
    case CallEvent::kCarrierMoved:
      return "carrier moved";
    case CallEvent::kFinalResponse:
      return "final response";
    case CallEvent::kEnd:
      return "end";
  }
  return "?";
}

}  // namespace mmserve::router
