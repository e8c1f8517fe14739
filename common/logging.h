// Minimal glog-style logging and CHECKs (Debian 12's abseil has no absl/log).
//
//   LOG(INFO) << "kv pool: " << num_blocks << " blocks";
//   CHECK(ptr != nullptr) << "block table missing for " << id;
//   CHECK_LE(used, budget);
//
// Lines go to stderr as "I1122 14:03:07.123456 4242 file.cc:17] message",
// written with one write() each so that threads do not interleave. LOG(FATAL)
// and failed CHECKs abort after printing. CHECK is for programmer invariants
// only; anything a user or peer can cause returns an absl::Status instead.
//
// The minimum severity printed comes from MMSERVE_LOG_LEVEL (INFO, WARNING,
// ERROR) or SetMinLogLevel(). Thread-safe.
#ifndef MMSERVE_COMMON_LOGGING_H_
#define MMSERVE_COMMON_LOGGING_H_

#include <sstream>
#include <string>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/status/status.h"

namespace mmserve {

enum class LogSeverity : int { kInfo = 0, kWarning = 1, kError = 2, kFatal = 3 };

void SetMinLogLevel(LogSeverity severity);
LogSeverity MinLogLevel();

namespace logging_internal {

// Collects one log line and emits it from the destructor.
class LogMessage {
 public:
  LogMessage(const char* file, int line, LogSeverity severity);
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  ~LogMessage();

  std::ostream& stream() { return stream_; }

 protected:
  // Writes the line to stderr; later calls do nothing.
  void Emit();

 private:
  bool emitted_ = false;
  const char* file_;
  int line_;
  LogSeverity severity_;
  std::ostringstream stream_;
};

// A LogMessage at kFatal severity whose destructor never returns.
class FatalLogMessage : public LogMessage {
 public:
  FatalLogMessage(const char* file, int line) : LogMessage(file, line, LogSeverity::kFatal) {}
  ABSL_ATTRIBUTE_NORETURN ~FatalLogMessage();
};

// Turns `stream << ...` into void so that it can sit in a ternary.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace logging_internal
}  // namespace mmserve

#define MMSERVE_LOG_INFO ::mmserve::LogSeverity::kInfo
#define MMSERVE_LOG_WARNING ::mmserve::LogSeverity::kWarning
#define MMSERVE_LOG_ERROR ::mmserve::LogSeverity::kError

#define LOG_INFO_IS_ON() (::mmserve::MinLogLevel() <= ::mmserve::LogSeverity::kInfo)

#define LOG(severity) LOG_##severity
#define LOG_INFO MMSERVE_LOG_AT(MMSERVE_LOG_INFO)
#define LOG_WARNING MMSERVE_LOG_AT(MMSERVE_LOG_WARNING)
#define LOG_ERROR MMSERVE_LOG_AT(MMSERVE_LOG_ERROR)
#define LOG_FATAL ::mmserve::logging_internal::FatalLogMessage(__FILE__, __LINE__).stream()

#define MMSERVE_LOG_AT(sev)                      \
  (sev) < ::mmserve::MinLogLevel()               \
      ? (void)0                                  \
      : ::mmserve::logging_internal::Voidify() & \
            ::mmserve::logging_internal::LogMessage(__FILE__, __LINE__, sev).stream()

#define CHECK(cond)                                                                 \
  ABSL_PREDICT_TRUE(cond)                                                           \
  ? (void)0                                                                         \
  : ::mmserve::logging_internal::Voidify() &                                        \
          ::mmserve::logging_internal::FatalLogMessage(__FILE__, __LINE__).stream() \
              << "Check failed: " #cond " "

#define MMSERVE_CHECK_OP(op, a, b)                                                  \
  ABSL_PREDICT_TRUE((a)op(b))                                                       \
  ? (void)0                                                                         \
  : ::mmserve::logging_internal::Voidify() &                                        \
          ::mmserve::logging_internal::FatalLogMessage(__FILE__, __LINE__).stream() \
              << "Check failed: " #a " " #op " " #b " (" << (a) << " vs. " << (b) << ") "

#define CHECK_EQ(a, b) MMSERVE_CHECK_OP(==, a, b)
#define CHECK_NE(a, b) MMSERVE_CHECK_OP(!=, a, b)
#define CHECK_LT(a, b) MMSERVE_CHECK_OP(<, a, b)
#define CHECK_LE(a, b) MMSERVE_CHECK_OP(<=, a, b)
#define CHECK_GT(a, b) MMSERVE_CHECK_OP(>, a, b)
#define CHECK_GE(a, b) MMSERVE_CHECK_OP(>=, a, b)
#define CHECK_OK(expr)                                          \
  do {                                                          \
    ::absl::Status mmserve_check_status_ = (expr);              \
    CHECK(mmserve_check_status_.ok()) << mmserve_check_status_; \
  } while (0)

#ifdef NDEBUG
#define DCHECK(cond) \
  while (false) CHECK(cond)
#define DCHECK_EQ(a, b) \
  while (false) CHECK_EQ(a, b)
#define DCHECK_LE(a, b) \
  while (false) CHECK_LE(a, b)
#define DCHECK_LT(a, b) \
  while (false) CHECK_LT(a, b)
#else
#define DCHECK(cond) CHECK(cond)
#define DCHECK_EQ(a, b) CHECK_EQ(a, b)
#define DCHECK_LE(a, b) CHECK_LE(a, b)
#define DCHECK_LT(a, b) CHECK_LT(a, b)
#endif

#endif  // MMSERVE_COMMON_LOGGING_H_
