// CarrierChain: which stream carries a call's tokens, and what the next one
// sent before its turn.
#include "router/carrier_chain.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace mmserve::router {
namespace {

using internal::v1::TokenBatch;
using Route = CarrierChain::Route;

TokenBatch Text(const std::string& text) {
  TokenBatch b;
  b.add_token_ids(7);
  b.set_text(text);
  return b;
}

CarrierChain Pd() {
  return CarrierChain({{.instance = 0, .hand_over = HandOver::kKvHandedOff}, {.instance = 1}});
}

TEST_CASE("the next stream's batches and OK close are held until the carrier hands over") {
  CarrierChain chain = Pd();
  CHECK(chain.OnBatch(1, Text("b")) == Route::kHeld);
  CHECK(chain.OnBatch(1, Text("c")) == Route::kHeld);
  CHECK(chain.OnClosedOk(1) == Route::kHeld);
  CHECK(chain.OnBatch(0, Text("a")) == Route::kCarry);
  CHECK(chain.carrier() == 0);

  TokenBatch handoff = Text("a2");
  CHECK_FALSE(chain.HandsOver(Text("a")));
  handoff.set_kv_handed_off(true);
  REQUIRE(chain.HandsOver(handoff));
  const CarrierChain::Held held = chain.Advance();
  REQUIRE(held.batches.size() == 2);
  CHECK(held.batches[0].text() == "b");
  CHECK(held.batches[1].text() == "c");
  CHECK(held.closed_ok);
  CHECK(chain.carrier() == 1);
  CHECK(chain.position() == 1);
  // The former carrier carries nothing now; the last carrier never hands over.
  CHECK(chain.OnBatch(0, Text("x")) == Route::kNone);
  CHECK(chain.OnClosedOk(0) == Route::kNone);
  CHECK(chain.OnBatch(1, Text("d")) == Route::kCarry);
  CHECK_FALSE(chain.HasNext());
  CHECK_FALSE(chain.HandsOver(handoff));
  CHECK(chain.Advance().batches.empty());
  CHECK(chain.carrier() == 1);
}

TEST_CASE("a carrier's OK close is its own; nothing is held once the next carries") {
  CarrierChain chain = Pd();
  CHECK(chain.OnClosedOk(0) == Route::kCarry);
  CHECK_FALSE(chain.ClosingHandsOver());  // a prefill closing early is the call's end
  CHECK(chain.Advance().batches.empty());
  CHECK(chain.OnClosedOk(1) == Route::kCarry);
}

TEST_CASE("an elastic chain: the sampler's first token, then each master's move") {
  // Member 2 samples, members 0 then 1 master; member 3 only keeps a span.
  CarrierChain chain({{.instance = 2, .hand_over = HandOver::kFirstToken},
                      {.instance = 0, .hand_over = HandOver::kMasterMoved},
                      {.instance = 1}});
  CHECK(chain.ClosingHandsOver());  // a sampler closing without a token hands over
  CHECK(chain.OnBatch(3, Text("span")) == Route::kNone);
  CHECK(chain.OnBatch(1, Text("early")) == Route::kNone);  // two moves away
  CHECK(chain.OnBatch(0, Text("b")) == Route::kHeld);
  TokenBatch empty;
  CHECK_FALSE(chain.HandsOver(empty));
  CHECK(chain.HandsOver(Text("a")));
  CHECK(chain.Advance().batches.size() == 1);
  CHECK(chain.carrier() == 0);

  TokenBatch moved;
  moved.mutable_elastic_moved()->add_generated_token_ids(1);
  CHECK_FALSE(chain.HandsOver(Text("c")));
  CHECK(chain.HandsOver(moved));
  CHECK(chain.OnBatch(1, Text("d")) == Route::kHeld);
  CHECK(chain.Advance().batches.size() == 1);
  CHECK(chain.carrier() == 1);
  CHECK_FALSE(chain.HandsOver(moved));  // the last master does not move on
}

TEST_CASE("a single stream carries everything and holds nothing") {
  CarrierChain chain(std::vector<Carrier>{{.instance = 0}});
  CHECK(chain.OnBatch(0, Text("a")) == Route::kCarry);
  CHECK(chain.OnClosedOk(0) == Route::kCarry);
  CHECK_FALSE(chain.HasNext());
  CHECK_FALSE(chain.ClosingHandsOver());
}

TEST_CASE("a master appended mid-call carries after the last one's move; early batches held") {
  // Member 0 samples, member 1 masters; member 2 joins as the next master.
  CarrierChain chain({{.instance = 0, .hand_over = HandOver::kFirstToken}, {.instance = 1}});
  CHECK(chain.HandsOver(Text("a")));
  chain.Advance();
  REQUIRE(chain.carrier() == 1);
  TokenBatch moved;
  moved.mutable_elastic_moved()->add_generated_token_ids(1);
  CHECK_FALSE(chain.HasNext());
  CHECK_FALSE(chain.HandsOver(moved));  // the last carrier before the append
  CHECK(chain.OnBatch(2, Text("early")) == Route::kNone);
  CHECK_FALSE(chain.Append({.instance = 1}));  // in the chain already
  CHECK(chain.size() == 2);
  REQUIRE(chain.Append({.instance = 2}));
  CHECK(chain.size() == 3);
  CHECK(chain.HasNext());
  CHECK(chain.OnBatch(2, Text("c")) == Route::kHeld);
  CHECK(chain.OnBatch(1, Text("b")) == Route::kCarry);
  CHECK_FALSE(chain.HandsOver(Text("b")));
  REQUIRE(chain.HandsOver(moved));
  const CarrierChain::Held held = chain.Advance();
  REQUIRE(held.batches.size() == 1);
  CHECK(held.batches[0].text() == "c");
  CHECK(chain.carrier() == 2);
  CHECK_FALSE(chain.HasNext());
  CHECK_FALSE(chain.HandsOver(moved));  // the new last carrier never hands over
  CHECK(chain.OnBatch(1, Text("x")) == Route::kNone);
  CHECK(chain.OnBatch(2, Text("d")) == Route::kCarry);
}

}  // namespace
}  // namespace mmserve::router
