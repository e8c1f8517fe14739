#include "client/repeated_flag.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace mmserve::client {

absl::StatusOr<std::vector<std::string>> ExtractRepeatedFlag(std::vector<char*>* args,
                                                             absl::string_view name) {
  std::vector<std::string> values;
  std::vector<char*> kept;
  kept.reserve(args->size());
  bool after_terminator = false;
  for (size_t i = 0; i < args->size(); ++i) {
    char* arg = (*args)[i];
    absl::string_view text(arg);
    if (i == 0 || after_terminator) {
      kept.push_back(arg);
      continue;
    }
    if (text == "--") {
      after_terminator = true;
      kept.push_back(arg);
      continue;
    }
    absl::string_view flag = text;
    if (!absl::ConsumePrefix(&flag, "--")) absl::ConsumePrefix(&flag, "-");
    if (flag.size() == text.size() || !absl::ConsumePrefix(&flag, name)) {
      kept.push_back(arg);
      continue;
    }
    if (flag.empty()) {  // "--name value"
      if (i + 1 >= args->size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      values.emplace_back((*args)[++i]);
    } else if (flag[0] == '=') {  // "--name=value"
      values.emplace_back(flag.substr(1));
    } else {  // another flag sharing the prefix, e.g. --images_dir
      kept.push_back(arg);
    }
  }
  *args = std::move(kept);
  return values;
}

}  // namespace mmserve::client
