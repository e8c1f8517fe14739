// Early-return helpers for absl::Status and absl::StatusOr (the abseil in
// Debian 12 predates its own).
//
//   absl::Status Load(const std::string& path) {
//     RETURN_IF_ERROR(CheckExists(path));
//     ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
//     ...
//   }
//
// ASSIGN_OR_RETURN moves the value out of the StatusOr; the left side may
// declare a new variable (`auto x`) or name an existing one.
#ifndef MMSERVE_COMMON_STATUS_MACROS_H_
#define MMSERVE_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MMSERVE_STATUS_CONCAT_INNER(a, b) a##b
#define MMSERVE_STATUS_CONCAT(a, b) MMSERVE_STATUS_CONCAT_INNER(a, b)

// Evaluates `expr` (an absl::Status) once; returns it from the enclosing
// function when it is not OK.
#define RETURN_IF_ERROR(expr)                                              \
  do {                                                                     \
    ::absl::Status mmserve_status_ = (expr);                               \
    if (ABSL_PREDICT_FALSE(!mmserve_status_.ok())) return mmserve_status_; \
  } while (0)

#define MMSERVE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr)    \
  auto tmp = (rexpr);                                     \
  if (ABSL_PREDICT_FALSE(!tmp.ok())) return tmp.status(); \
  lhs = std::move(tmp).value()

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, else
// assigns the value to `lhs`.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  MMSERVE_ASSIGN_OR_RETURN_IMPL(MMSERVE_STATUS_CONCAT(mmserve_statusor_, __LINE__), lhs, rexpr)

#endif  // MMSERVE_COMMON_STATUS_MACROS_H_
