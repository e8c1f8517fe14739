#include "common/flag_aliases.h"

#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mmserve {

absl::Status ApplyFlagAliases(std::initializer_list<FlagAlias> aliases) {
  for (const FlagAlias& alias : aliases) {
    absl::CommandLineFlag* old_flag = absl::FindCommandLineFlag(alias.old_name);
    absl::CommandLineFlag* new_flag = absl::FindCommandLineFlag(alias.new_name);
    if (old_flag == nullptr || new_flag == nullptr) {
      return absl::InternalError(absl::StrCat("flag alias --", alias.old_name, " -> --",
                                              alias.new_name, " names a flag that is not defined"));
    }
    // Abseil keeps "given on the command line" private: an old name left at its
    // default is taken as not given (giving it its default changes nothing).
    std::string value = old_flag->CurrentValue();
    if (value == old_flag->DefaultValue()) continue;
    if (new_flag->CurrentValue() != new_flag->DefaultValue() && new_flag->CurrentValue() != value) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", alias.old_name, "=", value, " and --", alias.new_name, "=",
                       new_flag->CurrentValue(), " disagree; --", alias.old_name,
                       " is the deprecated name of --", alias.new_name));
    }
    std::string error;
    if (!new_flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", alias.old_name, ": ", error));
    }
    LOG(WARNING) << "--" << alias.old_name << " is deprecated: use --" << alias.new_name;
  }
  return absl::OkStatus();
}

}  // namespace mmserve
