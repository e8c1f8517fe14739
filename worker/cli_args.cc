#include "worker/cli_args.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace mmserve::worker {

absl::StatusOr<std::vector<std::string>> TakeRepeatedFlag(int* argc, char** argv,
                                                          absl::string_view name) {
  std::vector<std::string> values;
  int out = 1;
  bool done = false;  // after "--", everything is positional
  for (int i = 1; i < *argc; ++i) {
    absl::string_view arg = argv[i];
    if (done || arg.size() < 2 || arg[0] != '-') {
      done = done || arg == "--";
      argv[out++] = argv[i];
      continue;
    }
    if (arg == "--") {
      done = true;
      argv[out++] = argv[i];
      continue;
    }
    absl::string_view body = arg.substr(arg[1] == '-' ? 2 : 1);
    if (body == name) {
      if (i + 1 >= *argc) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      values.emplace_back(argv[++i]);
    } else if (absl::StartsWith(body, name) && body.size() > name.size() &&
               body[name.size()] == '=') {
      values.emplace_back(body.substr(name.size() + 1));
    } else {
      argv[out++] = argv[i];
      continue;
    }
    if (values.back().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " has an empty value"));
    }
  }
  *argc = out;
  argv[out] = nullptr;
  return values;
}

}  // namespace mmserve::worker
