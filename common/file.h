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

// The last component of a directory path, trailing slashes ignored: the id a
// model directory is served under ("/models/Qwen2-VL-2B/" -> "Qwen2-VL-2B").
std::string ModelIdFromDir(const std::string& dir);

}  // namespace mmserve

#endif  // MMSERVE_COMMON_FILE_H_
