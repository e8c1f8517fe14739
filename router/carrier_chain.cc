#include "router/carrier_chain.h"

#include <utility>

namespace mmserve::router {

CarrierChain::CarrierChain(std::vector<Carrier> order) : order_(std::move(order)) {}

CarrierChain::Route CarrierChain::OnBatch(size_t stream, const internal::v1::TokenBatch& batch) {
  if (stream == carrier()) return Route::kCarry;
  if (HasNext() && stream == order_[at_ + 1].instance) {
    held_.batches.push_back(batch);
    return Route::kHeld;
  }
  return Route::kNone;
}

CarrierChain::Route CarrierChain::OnClosedOk(size_t stream) {
  if (stream == carrier()) return Route::kCarry;
  if (HasNext() && stream == order_[at_ + 1].instance) {
    held_.closed_ok = true;
    return Route::kHeld;
  }
  return Route::kNone;
}

bool CarrierChain::HandsOver(const internal::v1::TokenBatch& batch) const {
  switch (order_[at_].hand_over) {
    case HandOver::kNever:
      return false;
    case HandOver::kKvHandedOff:
      return batch.kv_handed_off();
    case HandOver::kFirstToken:
      return batch.token_ids_size() > 0;
    case HandOver::kMasterMoved:
      return batch.has_elastic_moved();
  }
  return false;
}

bool CarrierChain::Append(Carrier next) {
  for (const Carrier& c : order_) {
    if (c.instance == next.instance) return false;
  }
  order_.back().hand_over = HandOver::kMasterMoved;
  order_.push_back(next);
  return true;
}

CarrierChain::Held CarrierChain::Advance() {
  if (!HasNext()) return {};
  ++at_;
  Held held = std::move(held_);
  held_ = {};
  return held;
}

}  // namespace mmserve::router
