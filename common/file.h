// Whole-file reads for configs, tokenizers and test data.
//
//   ASSIGN_OR_RETURN(std::string text, ReadFileToString(dir + "/config.json"));
//
// NotFound when the file cannot be opened, Internal on a read error; the
// message names the path. Thread-safe.
#ifndef MMSERVE_COMMON_FILE_H_
#define MMSERVE_COMMON_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace mmserve {

[[nodiscard]] absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace mmserve

#endif  // MMSERVE_COMMON_FILE_H_
