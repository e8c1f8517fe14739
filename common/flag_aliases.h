// Renamed flags keep their old names for a while. The old flag is defined
// beside the new one, with the same default and help "deprecated: use --new";
// after parsing, each old name set away from its default sets its new flag,
// with one warning.
//
//   ABSL_FLAG(int, elastic_tick_ms, 20, "...");
//   ABSL_FLAG(int, esp_tick_ms, 20, "deprecated: use --elastic_tick_ms");
//   ...
//   absl::ParseCommandLine(argc, argv);
//   if (absl::Status s = ApplyFlagAliases({{"esp_tick_ms", "elastic_tick_ms"}}); !s.ok()) ...
//
// Giving both names with different values is an error, so that a script half
// way through a rename cannot run with a value it did not mean.
#ifndef MMSERVE_COMMON_FLAG_ALIASES_H_
#define MMSERVE_COMMON_FLAG_ALIASES_H_

#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace mmserve {

struct FlagAlias {
  absl::string_view old_name;
  absl::string_view new_name;
};

[[nodiscard]] absl::Status ApplyFlagAliases(std::initializer_list<FlagAlias> aliases);

}  // namespace mmserve

#endif  // MMSERVE_COMMON_FLAG_ALIASES_H_
