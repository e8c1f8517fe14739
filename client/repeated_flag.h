// Repeatable command-line flags whose values may hold commas.
//
//   std::vector<char*> args(argv, argv + argc);
//   std::vector<std::string> images = ExtractRepeatedFlag(&args, "image");
//   std::vector<std::string> stops = ExtractRepeatedFlag(&args, "stop");
//   absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
//
// absl's std::vector<std::string> flags split on commas (a path such as
// "shots/a,b.png" would become two) and a repeated absl flag keeps only its
// last value, so these flags are taken out of argv before absl sees the rest.
// Thread-compatible (call it from main before starting threads).
#ifndef MMSERVE_CLIENT_REPEATED_FLAG_H_
#define MMSERVE_CLIENT_REPEATED_FLAG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mmserve::client {

// Removes every "--name=value", "-name=value", "--name value" and
// "-name value" from args (args[0], the program, is kept; nothing after a
// bare "--" is touched) and returns the values in order. A "--name" with no
// value after it is INVALID_ARGUMENT.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ExtractRepeatedFlag(std::vector<char*>* args,
                                                                           absl::string_view name);

}  // namespace mmserve::client

#endif  // MMSERVE_CLIENT_REPEATED_FLAG_H_
