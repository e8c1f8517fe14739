#include "common/logging.h"

#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace mmserve {
namespace {

LogSeverity SeverityFromEnv() {
  const char* env = std::getenv("MMSERVE_LOG_LEVEL");
  if (env == nullptr) return LogSeverity::kInfo;
  if (std::strcmp(env, "WARNING") == 0) return LogSeverity::kWarning;
  if (std::strcmp(env, "ERROR") == 0) return LogSeverity::kError;
  return LogSeverity::kInfo;
}

std::atomic<int>& MinLevel() {
  static std::atomic<int> level{static_cast<int>(SeverityFromEnv())};
  return level;
}

const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash == nullptr ? path : slash + 1;
}

}  // namespace

void SetMinLogLevel(LogSeverity severity) {
  MinLevel().store(static_cast<int>(severity), std::memory_order_relaxed);
}

LogSeverity MinLogLevel() {
  return static_cast<LogSeverity>(MinLevel().load(std::memory_order_relaxed));
}

namespace logging_internal {

LogMessage::LogMessage(const char* file, int line, LogSeverity severity)
    : file_(file), line_(line), severity_(severity) {}

LogMessage::~LogMessage() { Emit(); }

void LogMessage::Emit() {
  if (emitted_) return;
  emitted_ = true;
  static constexpr char kLetters[] = {'I', 'W', 'E', 'F'};
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm local;
  localtime_r(&tv.tv_sec, &local);
  char prefix[96];
  std::snprintf(prefix, sizeof(prefix), "%c%02d%02d %02d:%02d:%02d.%06ld %ld %s:%d] ",
                kLetters[static_cast<int>(severity_)], local.tm_mon + 1, local.tm_mday,
                local.tm_hour, local.tm_min, local.tm_sec, static_cast<long>(tv.tv_usec),
                static_cast<long>(syscall(SYS_gettid)), Basename(file_), line_);
  std::string line = prefix + stream_.str() + "\n";
  // One write() per line keeps lines from different threads whole.
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

FatalLogMessage::~FatalLogMessage() {
  // The base destructor would run too late: emit here, then abort.
  Emit();
  std::abort();
}

}  // namespace logging_internal
}  // namespace mmserve
