// LD_PRELOAD shim for ThreadSanitizer runs against Debian's abseil.
//
// libabsl_synchronization.so from Debian is not built with -fsanitize=thread
// and carries no TSan annotations, so TSan cannot see the happens-before
// edges of absl::Mutex, CondVar and Notification: every field guarded by an
// absl::Mutex is then reported as a data race. This library interposes those
// entry points, calls the real ones (dlsym RTLD_NEXT), and tells TSan about
// the acquire/release on the object's address.
//
//   bazel test --config=tsan //transfer/...   (.bazelrc preloads it)
//
// Only for sanitizer runs; the mangled names are abseil 20220623 (debian3).
#include <dlfcn.h>

#include <cstdint>

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);

namespace {

struct Duration {  // absl::Duration's layout: passed by value in two registers
  int64_t hi;
  uint32_t lo;
};

template <typename Fn>
Fn Real(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) __builtin_trap();
  return reinterpret_cast<Fn>(f);
}

}  // namespace

#define MMSERVE_SHIM_VOID(mangled, before, after)             \
  extern "C" void mangled(void* self) {                       \
    static const auto real = Real<void (*)(void*)>(#mangled); \
    before;                                                   \
    real(self);                                               \
    after;                                                    \
  }

// Mutex: Lock / ReaderLock acquire; Unlock / ReaderUnlock release.
MMSERVE_SHIM_VOID(_ZN4absl7debian35Mutex4LockEv, , __tsan_acquire(self))
MMSERVE_SHIM_VOID(_ZN4absl7debian35Mutex10ReaderLockEv, , __tsan_acquire(self))
MMSERVE_SHIM_VOID(_ZN4absl7debian35Mutex6UnlockEv, __tsan_release(self), )
MMSERVE_SHIM_VOID(_ZN4absl7debian35Mutex12ReaderUnlockEv, __tsan_release(self), )
// Notification: Notify releases, the waits acquire.
MMSERVE_SHIM_VOID(_ZN4absl7debian312Notification6NotifyEv, __tsan_release(self), )
MMSERVE_SHIM_VOID(_ZNK4absl7debian312Notification19WaitForNotificationEv, , __tsan_acquire(self))

extern "C" bool _ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE(
    void* self, Duration d) {
  static const auto real = Real<bool (*)(void*, Duration)>(
      "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool r = real(self, d);
  if (r) __tsan_acquire(self);
  return r;
}

extern "C" bool _ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE(
    void* self, Duration t) {
  static const auto real = Real<bool (*)(void*, Duration)>(
      "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool r = real(self, t);
  if (r) __tsan_acquire(self);
  return r;
}

extern "C" bool _ZN4absl7debian35Mutex7TryLockEv(void* self) {
  static const auto real = Real<bool (*)(void*)>("_ZN4absl7debian35Mutex7TryLockEv");
  const bool locked = real(self);
  if (locked) __tsan_acquire(self);
  return locked;
}

extern "C" bool _ZN4absl7debian35Mutex13ReaderTryLockEv(void* self) {
  static const auto real = Real<bool (*)(void*)>("_ZN4absl7debian35Mutex13ReaderTryLockEv");
  const bool locked = real(self);
  if (locked) __tsan_acquire(self);
  return locked;
}

// Await and LockWhen may drop and retake the lock: release before, acquire after.
extern "C" void _ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE(void* self, const void* cond) {
  static const auto real =
      Real<void (*)(void*, const void*)>("_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  __tsan_release(self);
  real(self, cond);
  __tsan_acquire(self);
}

extern "C" void _ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE(void* self, const void* cond) {
  static const auto real =
      Real<void (*)(void*, const void*)>("_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  real(self, cond);
  __tsan_acquire(self);
}

extern "C" bool _ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE(
    void* self, const void* cond, Duration d) {
  static const auto real = Real<bool (*)(void*, const void*, Duration)>(
      "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  __tsan_release(self);
  const bool r = real(self, cond, d);
  __tsan_acquire(self);
  return r;
}

extern "C" bool _ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE(
    void* self, const void* cond, Duration t) {
  static const auto real = Real<bool (*)(void*, const void*, Duration)>(
      "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_release(self);
  const bool r = real(self, cond, t);
  __tsan_acquire(self);
  return r;
}

// CondVar waits drop and retake the caller's mutex.
extern "C" void _ZN4absl7debian37CondVar4WaitEPNS0_5MutexE(void* self, void* mu) {
  static const auto real =
      Real<void (*)(void*, void*)>("_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  real(self, mu);
  __tsan_acquire(mu);
}

extern "C" bool _ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE(void* self,
                                                                                     void* mu,
                                                                                     Duration d) {
  static const auto real = Real<bool (*)(void*, void*, Duration)>(
      "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  const bool r = real(self, mu, d);
  __tsan_acquire(mu);
  return r;
}

extern "C" bool _ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE(void* self,
                                                                                  void* mu,
                                                                                  Duration t) {
  static const auto real = Real<bool (*)(void*, void*, Duration)>(
      "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  const bool r = real(self, mu, t);
  __tsan_acquire(mu);
  return r;
}
