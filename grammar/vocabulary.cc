#include <utility>

#include "grammar/grammar.h"

namespace mmserve::grammar {
namespace {

std::vector<int32_t> OrdinaryTokens(const std::vector<std::string>& bytes,
                                    const std::vector<bool>& special,
                                    const std::vector<bool>& is_eos) {
  std::vector<int32_t> ids;
  for (size_t id = 0; id < bytes.size(); ++id) {
    if (!special[id] && !is_eos[id] && !bytes[id].empty()) {
      ids.push_back(static_cast<int32_t>(id));
    }
  }
  return ids;
}

}  // namespace

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, std::vector<bool> special,
                       std::vector<int32_t> eos)
    : token_bytes_(std::move(token_bytes)),
      special_(std::move(special)),
      is_eos_(token_bytes_.size(), false) {
  special_.resize(token_bytes_.size(), false);
  for (int32_t id : eos) {
    if (id >= 0 && id < size()) {
      is_eos_[id] = true;
      special_[id] = false;  // tokenizers list eos among their special tokens
      eos_.push_back(id);
    }
  }
  trie_ = TokenTrie(token_bytes_, OrdinaryTokens(token_bytes_, special_, is_eos_));
}

}  // namespace mmserve::grammar
