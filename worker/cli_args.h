// Command-line helpers for the worker tools.
//
//   std::vector<std::string> images = TakeRepeatedFlag(&argc, argv, "image");
//   absl::ParseCommandLine(argc, argv);
//
// absl flags keep only the last value of a repeated flag, so a flag that may
// be given several times is taken out of argv first, each occurrence one
// value (commas included). Not thread-safe (edits argv).
#ifndef MMSERVE_WORKER_CLI_ARGS_H_
#define MMSERVE_WORKER_CLI_ARGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mmserve::worker {

// Removes every "--name=value", "-name=value", "--name value" and
// "-name value" from argv[1..] (up to a "--" terminator) and returns the
// values in order. InvalidArgument when the flag ends the line without a
// value or has an empty one.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> TakeRepeatedFlag(int* argc, char** argv,
                                                                        absl::string_view name);

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_CLI_ARGS_H_
