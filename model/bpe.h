// Byte-pair encoding over a byte-level vocabulary, as Hugging Face's "BPE"
// model does with no dropout, no unknown token and no byte fallback: a word
// starts as its characters and the adjacent pair with the lowest merge rank
// is merged until no ranked pair remains.
//
//   ASSIGN_OR_RETURN(BpeModel bpe, BpeModel::Create(vocab, merges, false));
//   std::vector<int32_t> ids;
//   RETURN_IF_ERROR(bpe.Encode(BytesToByteLevel(" world"), &ids));
//
// Immutable after Create; Encode is thread-safe.
#ifndef MMSERVE_MODEL_BPE_H_
#define MMSERVE_MODEL_BPE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mmserve::model {

class BpeModel {
 public:
  // `vocab` maps token strings to ids; `merges` are pairs in rank order (the
  // first merges first). Every merge's parts and result must be in the vocab.
  // With `ignore_merges`, a word that is itself in the vocab is one token.
  [[nodiscard]] static absl::StatusOr<BpeModel> Create(
      absl::flat_hash_map<std::string, int32_t> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges);

  // Appends the ids of one word (byte-level text). InvalidArgument when a
  // character of it has no token (a vocabulary without the byte alphabet).
  [[nodiscard]] absl::Status Encode(absl::string_view word, std::vector<int32_t>* out) const;

  // nullopt-like: -1 when the string is not a token.
  int32_t TokenToId(absl::string_view token) const;
  size_t vocab_size() const { return vocab_.size(); }
  const absl::flat_hash_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  bool ignore_merges_ = false;
};

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_BPE_H_
