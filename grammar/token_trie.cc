#include "grammar/token_trie.h"

#include <algorithm>

namespace mmserve::grammar {

TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes, std::vector<int32_t> ids) {
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return token_bytes[a] != token_bytes[b] ? token_bytes[a] < token_bytes[b] : a < b;
  });
  nodes_.push_back(Node{});
  std::vector<int32_t> path = {0};  // node indices from the root
  std::string prefix;               // the bytes of `path`
  for (int32_t id : ids) {
    const std::string& bytes = token_bytes[id];
    size_t common = 0;
    while (common < prefix.size() && common < bytes.size() && prefix[common] == bytes[common]) {
      ++common;
    }
    while (prefix.size() > common) {
      nodes_[path.back()].end = static_cast<int32_t>(nodes_.size());
      path.pop_back();
      prefix.pop_back();
    }
    for (size_t i = common; i < bytes.size(); ++i) {
      Node node;
      node.byte = static_cast<uint8_t>(bytes[i]);
      node.depth = static_cast<int32_t>(i + 1);
      node.parent = path.back();
      node.first_token = static_cast<int32_t>(token_ids_.size());
      path.push_back(static_cast<int32_t>(nodes_.size()));
      nodes_.push_back(node);
      prefix += bytes[i];
    }
    max_depth_ = std::max<int>(max_depth_, bytes.size());
    Node& last = nodes_[path.back()];
    if (last.num_tokens == 0) {
      last.first_token = static_cast<int32_t>(token_ids_.size());
    }
    token_ids_.push_back(id);
    ++last.num_tokens;
  }
  for (int32_t node : path) {
    nodes_[node].end = static_cast<int32_t>(nodes_.size());
  }
}

}  // namespace mmserve::grammar
