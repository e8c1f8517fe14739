// Property checks inside fuzz targets. A failed FUZZ_CHECK prints the
// condition and aborts: libFuzzer saves the input as a crash, and the corpus
// replay test (fuzz.bzl) fails. Unlike CHECK it is active in every build and
// never depends on logging setup.
//
//   FUZZ_CHECK(decoded.width == header.width) << "header " << header.width;
#ifndef MMSERVE_FUZZ_FUZZ_CHECK_H_
#define MMSERVE_FUZZ_FUZZ_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <sstream>

namespace mmserve::fuzz {

// Collects the streamed context, prints it with the failed condition and
// aborts when destroyed.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition) {
    stream_ << file << ":" << line << ": property failed: " << condition << ": ";
  }
  [[noreturn]] ~CheckFailure() {
    std::cerr << stream_.str() << std::endl;
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace mmserve::fuzz

// A loop, not if/else, so that an unbraced `if (x) FUZZ_CHECK(y) << z;` has
// no dangling else; the body never returns.
#define FUZZ_CHECK(condition) \
  while (!(condition)) ::mmserve::fuzz::CheckFailure(__FILE__, __LINE__, #condition).stream()

// libFuzzer's entry point, defined once by every target.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#endif  // MMSERVE_FUZZ_FUZZ_CHECK_H_
