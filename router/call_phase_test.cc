#include "router/call_phase.h"

#include <catch2/catch.hpp>
#include <set>
#include <utility>
#include <vector>

namespace mmserve::router {
namespace {

using P = CallPhase;
using E = CallEvent;

constexpr P kPhases[] = {P::kPlacing,    P::kPrefilling, P::kDecoding,
                         P::kHandedOver, P::kFinalHeld,  P::kEnded};
constexpr E kEvents[] = {E::kPrefillStarted, E::kFirstToken, E::kCarrierMoved, E::kFinalResponse,
                         E::kEnd};

P Walk(P phase, const std::vector<E>& events) {
  for (E e : events) {
    std::optional<P> next = NextPhase(phase, e);
    REQUIRE(next.has_value());
    phase = *next;
  }
  return phase;
}

TEST_CASE("a colocated call goes placing, prefilling, decoding, final held, ended") {
  CHECK(NextPhase(P::kPlacing, E::kPrefillStarted) == P::kPrefilling);
  CHECK(NextPhase(P::kPrefilling, E::kFirstToken) == P::kDecoding);
  CHECK(NextPhase(P::kDecoding, E::kFinalResponse) == P::kFinalHeld);
  CHECK(NextPhase(P::kFinalHeld, E::kEnd) == P::kEnded);
}

TEST_CASE("a P/D call passes through handed over after the hand-off batch") {
  CHECK(Walk(P::kPlacing, {E::kPrefillStarted, E::kFirstToken, E::kCarrierMoved}) ==
        P::kHandedOver);
  CHECK(NextPhase(P::kHandedOver, E::kFinalResponse) == P::kFinalHeld);
  // A hand-off batch without a token still hands off.
  CHECK(NextPhase(P::kPrefilling, E::kCarrierMoved) == P::kHandedOver);
}

TEST_CASE("every elastic master move is a carrier move that stays handed over") {
  CHECK(Walk(P::kPlacing, {E::kPrefillStarted, E::kFirstToken, E::kCarrierMoved, E::kCarrierMoved,
                           E::kCarrierMoved}) == P::kHandedOver);
  CHECK(Walk(P::kPlacing, {E::kPrefillStarted, E::kFirstToken, E::kCarrierMoved, E::kCarrierMoved,
                           E::kFinalResponse, E::kEnd}) == P::kEnded);
}

TEST_CASE("a first token that is also the last holds the final response at once") {
  CHECK(NextPhase(P::kPrefilling, E::kFinalResponse) == P::kFinalHeld);
}

TEST_CASE("every phase but ended can end, and ended ignores everything") {
  for (P p : kPhases) {
    if (p == P::kEnded) continue;
    CHECK(NextPhase(p, E::kEnd) == P::kEnded);
  }
  for (E e : kEvents) CHECK_FALSE(NextPhase(P::kEnded, e).has_value());
}

TEST_CASE("the table has exactly the documented transitions, all forward but a repeated move") {
  const std::set<std::pair<P, E>> allowed = {
      {P::kPlacing, E::kPrefillStarted},
      {P::kPrefilling, E::kFirstToken},
      {P::kPrefilling, E::kCarrierMoved},
      {P::kDecoding, E::kCarrierMoved},
      {P::kHandedOver, E::kCarrierMoved},
      {P::kPrefilling, E::kFinalResponse},
      {P::kDecoding, E::kFinalResponse},
      {P::kHandedOver, E::kFinalResponse},
      {P::kPlacing, E::kEnd},
      {P::kPrefilling, E::kEnd},
      {P::kDecoding, E::kEnd},
      {P::kHandedOver, E::kEnd},
      {P::kFinalHeld, E::kEnd},
  };
  for (P p : kPhases) {
    for (E e : kEvents) {
      INFO(PhaseName(p) << " + " << EventName(e));
      std::optional<P> next = NextPhase(p, e);
      CHECK(next.has_value() == (allowed.count({p, e}) == 1));
      if (next && e == E::kCarrierMoved && p == P::kHandedOver) {
        CHECK(*next == p);
      } else if (next) {
        CHECK(*next > p);
      }
    }
  }
}

TEST_CASE("no token is streamed before decoding and nothing moves after the final response") {
  CHECK_FALSE(NextPhase(P::kPlacing, E::kFirstToken).has_value());
  CHECK_FALSE(NextPhase(P::kPlacing, E::kFinalResponse).has_value());
  CHECK_FALSE(NextPhase(P::kPlacing, E::kCarrierMoved).has_value());
  CHECK_FALSE(NextPhase(P::kFinalHeld, E::kFinalResponse).has_value());
  CHECK_FALSE(NextPhase(P::kFinalHeld, E::kCarrierMoved).has_value());
  CHECK_FALSE(NextPhase(P::kDecoding, E::kPrefillStarted).has_value());
}

}  // namespace
}  // namespace mmserve::router
