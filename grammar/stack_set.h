// A set of automaton stacks stored back to back in one buffer, so that a
// step over a byte allocates nothing once the buffers have grown.
#ifndef MMSERVE_GRAMMAR_STACK_SET_H_
#define MMSERVE_GRAMMAR_STACK_SET_H_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "absl/types/span.h"

namespace mmserve::grammar {

// A stack of automaton states, bottom first (see automaton.h).
using StackView = absl::Span<const int32_t>;

class StackSet {
 public:
  StackSet() = default;
  explicit StackSet(StackView stack) { Push(stack); }

  int size() const { return static_cast<int>(begin_.size()) - 1; }
  bool empty() const { return size() == 0; }
  StackView operator[](int i) const {
    return StackView(data_.data() + begin_[i], begin_[i + 1] - begin_[i]);
  }
  void Clear() {
    data_.clear();
    begin_.resize(1);
  }
  void Push(StackView stack) {
    data_.insert(data_.end(), stack.begin(), stack.end());
    begin_.push_back(static_cast<uint32_t>(data_.size()));
  }
  // Appends the stack prefix + middle + last.
  void Push(StackView prefix, StackView middle, int32_t last) {
    data_.insert(data_.end(), prefix.begin(), prefix.end());
    data_.insert(data_.end(), middle.begin(), middle.end());
    data_.push_back(last);
    begin_.push_back(static_cast<uint32_t>(data_.size()));
  }
  // Sorts the stacks and drops duplicates.
  void Dedupe() {
    if (size() < 2) return;
    std::vector<int> order(size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) {
      const StackView x = (*this)[a], y = (*this)[b];
      return std::lexicographical_compare(x.begin(), x.end(), y.begin(), y.end());
    });
    StackSet out;
    for (size_t i = 0; i < order.size(); ++i) {
      if (i > 0 && (*this)[order[i]] == (*this)[order[i - 1]]) continue;
      out.Push((*this)[order[i]]);
    }
    *this = std::move(out);
  }
  // The stacks' contents, as a cache key.
  const std::vector<int32_t>& data() const { return data_; }
  const std::vector<uint32_t>& begins() const { return begin_; }

  friend bool operator==(const StackSet& a, const StackSet& b) {
    return a.data_ == b.data_ && a.begin_ == b.begin_;
  }

 private:
  std::vector<int32_t> data_;
  std::vector<uint32_t> begin_ = {0};
};

}  // namespace mmserve::grammar

#endif  // MMSERVE_GRAMMAR_STACK_SET_H_
