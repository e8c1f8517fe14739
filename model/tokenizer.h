// A Hugging Face tokenizer.json of the Qwen2 family: added/special tokens,
// NFC normalization, the Qwen2 split pre-tokenizer, byte-level BPE, and the
// byte-level decoder. Components other than these are rejected when loading
// (UnimplementedError naming the component), never silently approximated.
//
//   ASSIGN_OR_RETURN(auto tok, Tokenizer::FromFile(dir + "/tokenizer.json"));
//   ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode("<|im_start|>user\nhi"));
//   ASSIGN_OR_RETURN(std::string text, tok->Decode(ids, /*skip_special=*/true));
//
// Immutable after loading; every method is thread-safe.
#ifndef MMSERVE_MODEL_TOKENIZER_H_
#define MMSERVE_MODEL_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/bpe.h"

namespace mmserve::model {

// An entry of tokenizer.json's "added_tokens".
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;       // absorb whitespace on the left
  bool rstrip = false;       // absorb whitespace on the right
  bool single_word = false;  // match only between non-word characters
};

class Tokenizer {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      const std::string& json, const std::string& origin);

  // Token ids of `text`. With `parse_special`, special tokens written in the
  // text become their ids (as transformers does by default); without it they
  // are tokenized as plain text.
  [[nodiscard]] absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                                            bool parse_special = true) const;

  // Text of `ids`, invalid UTF-8 replaced by U+FFFD. InvalidArgument for an
  // id outside the vocabulary.
  [[nodiscard]] absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                                   bool skip_special = false) const;

  // Appends the raw bytes token `id` stands for (possibly part of a UTF-8
  // character). False for an unknown id.
  bool AppendTokenBytes(int32_t id, std::string* out) const;

  // -1 when `token` is not a token string.
  int32_t TokenToId(absl::string_view token) const;
  // The token's string as the vocabulary spells it; empty for unknown ids.
  absl::string_view IdToToken(int32_t id) const;
  bool IsSpecial(int32_t id) const;
  // One past the largest id (the embedding table must be at least this big).
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }
  const std::vector<AddedToken>& added_tokens() const { return added_; }

 private:
  Tokenizer() = default;
  // Appends the ids of plain text (no added tokens in it).
  absl::Status EncodePlain(absl::string_view text, std::vector<int32_t>* out) const;
  // Leftmost-longest added token at or after `from`; false when none.
  bool FindAddedToken(absl::string_view text, size_t from, bool parse_special, size_t* begin,
                      size_t* end, const AddedToken** token) const;

  std::unique_ptr<BpeModel> bpe_;
  bool nfc_ = false;
  std::vector<AddedToken> added_;
  absl::flat_hash_map<int32_t, size_t> added_by_id_;
  std::vector<std::string> id_to_token_;
};

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_TOKENIZER_H_
