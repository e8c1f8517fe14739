// GPT-2's byte-level alphabet: every byte maps to one printable code point,
// so BPE vocabularies hold only visible characters ("Ġ" is the space byte).
// Decoding follows Hugging Face's ByteLevel decoder: a token whose every
// character is in the alphabet becomes those bytes, any other token (e.g. an
// added token such as "<|im_end|>" containing a raw space) is taken as its
// own UTF-8 bytes. Thread-safe.
#ifndef MMSERVE_MODEL_BYTE_LEVEL_H_
#define MMSERVE_MODEL_BYTE_LEVEL_H_

#include <string>

#include "absl/strings/string_view.h"

namespace mmserve::model {

// Maps each byte of `bytes` to its alphabet character (UTF-8 encoded).
std::string BytesToByteLevel(absl::string_view bytes);

// Appends the bytes a token stands for (see the header comment).
void AppendTokenBytes(absl::string_view token, std::string* out);

// Converts bytes to valid UTF-8 the way Rust's String::from_utf8_lossy does:
// each maximal invalid subsequence becomes one U+FFFD.
std::string Utf8Lossy(absl::string_view bytes);

// Bytes at the end of `bytes` that form an incomplete but still valid UTF-8
// sequence (0 to 3): text a streaming decoder must hold back.
size_t IncompleteUtf8Suffix(absl::string_view bytes);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_BYTE_LEVEL_H_
