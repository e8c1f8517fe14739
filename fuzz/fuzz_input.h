// Splits a fuzz input into typed values, like clang's FuzzedDataProvider
// (which gcc builds do not have). Reads past the end yield zeros and empty
// strings, so every byte string is a valid input.
//
//   FuzzInput in(data, size);
//   const int op = in.Byte() % 8;
//   const std::string name = in.String(16);
#ifndef MMSERVE_FUZZ_FUZZ_INPUT_H_
#define MMSERVE_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace mmserve::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return size_ == 0; }
  size_t remaining() const { return size_; }

  uint8_t Byte() {
    if (size_ == 0) return 0;
    --size_;
    return *data_++;
  }
  bool Bool() { return Byte() & 1; }
  uint32_t U32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | Byte();
    return v;
  }
  // A length byte (mod max_len + 1), then that many bytes (fewer at the end).
  std::string String(size_t max_len) {
    size_t n = Byte() % (max_len + 1);
    if (n > size_) n = size_;
    std::string s(reinterpret_cast<const char*>(data_), n);
    data_ += n;
    size_ -= n;
    return s;
  }
  // Everything left.
  std::string Rest() {
    std::string s(reinterpret_cast<const char*>(data_), size_);
    data_ += size_;
    size_ = 0;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
};

}  // namespace mmserve::fuzz

#endif  // MMSERVE_FUZZ_FUZZ_INPUT_H_
