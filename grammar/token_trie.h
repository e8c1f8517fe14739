// A vocabulary's tokens as a byte trie laid out in preorder, so that a walk
// visits shared prefixes once and skips a whole subtree with one jump.
#ifndef MMSERVE_GRAMMAR_TOKEN_TRIE_H_
#define MMSERVE_GRAMMAR_TOKEN_TRIE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace mmserve::grammar {

class TokenTrie {
 public:
  struct Node {
    uint8_t byte = 0;         // the byte that leads here from the parent
    int32_t depth = 0;        // bytes from the root
    int32_t parent = -1;      // the node one byte up (-1 at the root)
    int32_t end = 0;          // first node after this node's subtree
    int32_t first_token = 0;  // tokens ending here: token_ids()[first, +count)
    int32_t num_tokens = 0;
  };

  TokenTrie() = default;
  // Every id of `ids` (tokens with non-empty bytes) in the trie.
  TokenTrie(const std::vector<std::string>& token_bytes, std::vector<int32_t> ids);

  // nodes()[0] is the root (depth 0, no tokens); the rest in preorder.
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& token_ids() const { return token_ids_; }
  int max_depth() const { return max_depth_; }

 private:
  std::vector<Node> nodes_;
  std::vector<int32_t> token_ids_;
  int max_depth_ = 0;
};

}  // namespace mmserve::grammar

#endif  // MMSERVE_GRAMMAR_TOKEN_TRIE_H_
