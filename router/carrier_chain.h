// The order in which a call's token streams carry its tokens (placer.h
// Carrier), and what the next stream sent before its turn. One stream
// carries at a time; stream i+1's batches, and its OK close, are held until
// stream i hands over (Advance), then replayed in order. Streams that are
// neither the carrier nor the next (an elastic member that only keeps a
// span, a carrier whose turn is over, a master two moves away: it is sent
// nothing to carry before its move) carry nothing.
//
//   CarrierChain chain({{.instance = 0, .hand_over = HandOver::kKvHandedOff},
//                       {.instance = 1}});
//   switch (chain.OnBatch(stream, batch)) {
//     case CarrierChain::Route::kCarry: ...;  // relay it
//     case CarrierChain::Route::kHeld: case CarrierChain::Route::kNone: break;
//   }
//   if (chain.HandsOver(batch)) {
//     CarrierChain::Held early = chain.Advance();  // replay early.batches
//   }
//
// A chain may grow at its end mid-call (Append: a master joins an elastic
// request that runs out of KV where it decodes).
//
// Not thread-safe: the call guards it with its lock.
#ifndef MMSERVE_ROUTER_CARRIER_CHAIN_H_
#define MMSERVE_ROUTER_CARRIER_CHAIN_H_

#include <cstddef>
#include <vector>

#include "proto/language.pb.h"
#include "router/placer.h"

namespace mmserve::router {

class CarrierChain {
 public:
  // `order` is non-empty.
  explicit CarrierChain(std::vector<Carrier> order);

  enum class Route : uint8_t {
    kCarry,  // from the carrier: relay it
    kHeld,   // from the next carrier, before its turn: kept for Advance
    kNone,   // from a stream that carries nothing now
  };
  Route OnBatch(size_t stream, const internal::v1::TokenBatch& batch);
  // A stream closed OK; kHeld: the next carrier's, kept for Advance.
  Route OnClosedOk(size_t stream);

  // Whether `batch`, carried by the current carrier, ends its turn.
  bool HandsOver(const internal::v1::TokenBatch& batch) const;
  // Whether an OK close of the current carrier ends its turn (an elastic
  // sampler without a first token); else it is the call's last stream.
  bool ClosingHandsOver() const { return order_[at_].hand_over == HandOver::kFirstToken; }

  // What the next carrier sent before its turn.
  struct Held {
    std::vector<internal::v1::TokenBatch> batches;
    bool closed_ok = false;
  };
  // The next carrier carries from now on; false (nothing moves) for the last.
  bool HasNext() const { return at_ + 1 < order_.size(); }
  Held Advance();

  // Appends `next` as the last carrier (an elastic request's chain
  // extended mid-call with a new master): the carrier last until now hands
  // over when its master moves (HandOver::kMasterMoved); `next`'s own
  // hand-over is as given. False (nothing changes) when `next`'s stream is
  // in the chain already.
  bool Append(Carrier next);

  size_t carrier() const { return order_[at_].instance; }
  size_t size() const { return order_.size(); }
  size_t position() const { return at_; }

 private:
  std::vector<Carrier> order_;
  size_t at_ = 0;
  Held held_;
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_CARRIER_CHAIN_H_
