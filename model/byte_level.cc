#include "model/byte_level.h"

#include <array>
#include <cstdint>

#include "model/unicode.h"

namespace mmserve::model {
namespace {

struct Alphabet {
  std::array<char32_t, 256> byte_to_char;
  // Alphabet characters are all below U+0144.
  std::array<int16_t, 0x144> char_to_byte;

  Alphabet() {
    char_to_byte.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
      byte_to_char[b] = printable ? b : next++;
      char_to_byte[byte_to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& GetAlphabet() {
  static const Alphabet alphabet;
  return alphabet;
}

// Length of the valid prefix of a UTF-8 sequence starting at p (n bytes
// available), following the Unicode table of well-formed sequences; *complete
// says whether that prefix is a whole character.
size_t ValidSequencePrefix(const uint8_t* p, size_t n, bool* complete) {
  *complete = false;
  uint8_t b0 = p[0];
  if (b0 < 0x80) {
    *complete = true;
    return 1;
  }
  size_t len;
  uint8_t lo = 0x80, hi = 0xbf;  // allowed range of the second byte
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    len = 2;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    len = 3;
    if (b0 == 0xe0) lo = 0xa0;
    if (b0 == 0xed) hi = 0x9f;
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    len = 4;
    if (b0 == 0xf0) lo = 0x90;
    if (b0 == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  size_t i = 1;
  for (; i < len && i < n; ++i) {
    uint8_t lo_i = i == 1 ? lo : 0x80, hi_i = i == 1 ? hi : 0xbf;
    if (p[i] < lo_i || p[i] > hi_i) return i;
  }
  *complete = i == len;
  return i;
}

}  // namespace

std::string BytesToByteLevel(absl::string_view bytes) {
  const Alphabet& a = GetAlphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendUtf8(a.byte_to_char[static_cast<uint8_t>(c)], &out);
  return out;
}

void AppendTokenBytes(absl::string_view token, std::string* out) {
  const Alphabet& a = GetAlphabet();
  const size_t start = out->size();
  size_t pos = 0;
  while (pos < token.size()) {
    char32_t cp = NextCodePoint(token, &pos);
    int b = cp < a.char_to_byte.size() ? a.char_to_byte[cp] : -1;
    if (b < 0) {  // not byte-level text: take the token's own bytes
      out->resize(start);
      out->append(token.data(), token.size());
      return;
    }
    out->push_back(static_cast<char>(b));
  }
}

std::string Utf8Lossy(absl::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    bool complete;
    size_t n = ValidSequencePrefix(p + i, bytes.size() - i, &complete);
    if (complete) {
      out.append(bytes.data() + i, n);
      i += n;
    } else {
      out.append("\xef\xbf\xbd");  // U+FFFD for the maximal invalid subsequence
      i += n == 0 ? 1 : n;
    }
  }
  return out;
}

size_t IncompleteUtf8Suffix(absl::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    uint8_t b = p[n - back];
    if ((b & 0xc0) == 0x80) continue;  // continuation byte: keep looking for the lead
    bool complete;
    size_t valid = ValidSequencePrefix(p + n - back, back, &complete);
    return (!complete && valid == back) ? back : 0;
  }
  return 0;
}

}  // namespace mmserve::model
