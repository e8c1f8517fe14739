#include "model/unicode.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "common/logging.h"

namespace mmserve::model {
namespace {

// Bytes in the sequence a lead byte starts, 0 for a byte that cannot lead.
int SequenceLength(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xc2 && lead <= 0xdf) return 2;
  if (lead >= 0xe0 && lead <= 0xef) return 3;
  if (lead >= 0xf0 && lead <= 0xf4) return 4;
  return 0;
}

// Decodes one sequence of `len` bytes; false when malformed (bad
// continuation, overlong, surrogate or above U+10FFFF).
bool Decode(const uint8_t* p, int len, char32_t* cp) {
  char32_t c = len == 1 ? p[0] : p[0] & (0x7f >> len);
  for (int i = 1; i < len; ++i) {
    if ((p[i] & 0xc0) != 0x80) return false;
    c = (c << 6) | (p[i] & 0x3f);
  }
  static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (c < kMin[len] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return false;
  *cp = c;
  return true;
}

}  // namespace

char32_t NextCodePoint(absl::string_view s, size_t* pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + *pos;
  int len = SequenceLength(p[0]);
  char32_t cp;
  if (len == 0 || *pos + len > s.size() || !Decode(p, len, &cp)) {
    *pos += 1;
    return 0xfffd;
  }
  *pos += len;
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

bool IsLetter(char32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_L_MASK) != 0;
}

bool IsNumber(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_N_MASK) != 0;
}

bool IsWhitespace(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= '\t' && cp <= '\r');
  if (cp == 0x85) return true;
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & (U_GC_ZS_MASK | U_GC_ZL_MASK | U_GC_ZP_MASK)) !=
         0;
}

std::string NormalizeNfc(absl::string_view s) {
  bool ascii = true;
  for (char c : s) ascii &= static_cast<uint8_t>(c) < 0x80;
  if (ascii || ValidUtf8Prefix(s) != s.size()) return std::string(s);
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(err);
  CHECK(U_SUCCESS(err)) << "ICU NFC data missing: " << u_errorName(err);
  icu::UnicodeString in = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), s.size()));
  if (nfc->isNormalized(in, err) && U_SUCCESS(err)) return std::string(s);
  err = U_ZERO_ERROR;
  icu::UnicodeString out = nfc->normalize(in, err);
  CHECK(U_SUCCESS(err)) << "ICU NFC failed: " << u_errorName(err);
  std::string result;
  out.toUTF8String(result);
  return result;
}

size_t ValidUtf8Prefix(absl::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    int len = SequenceLength(p[i]);
    char32_t cp;
    if (len == 0 || i + len > s.size() || !Decode(p + i, len, &cp)) break;
    i += len;
  }
  return i;
}

}  // namespace mmserve::model
