// Whether this build runs under a sanitizer, for the few bounds in tests
// that are times (a kill must end a call within 2 s, a CPU budget):
//
//   CHECK(ended_after_kill < absl::Seconds(2) * kSanitizerSlowdown);
//
// Thread-safety: constants only.
#ifndef MMSERVE_COMMON_SANITIZER_H_
#define MMSERVE_COMMON_SANITIZER_H_

namespace mmserve {

// How many times slower sanitizer builds run the processes.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr int kSanitizerSlowdown = 3;
#else
inline constexpr int kSanitizerSlowdown = 1;
#endif

}  // namespace mmserve

#endif  // MMSERVE_COMMON_SANITIZER_H_
