// JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes
// it, which is what the chat templates' `tojson` filter produces (the
// transformers chat-template environment's tojson keeps key order and
// non-ASCII text): ", " between items, ": " after keys, keys in the order
// given, UTF-8 kept as is, control characters as \n, \t, ... or \u00XX,
// floats in their shortest round-trip form with ".0" on integral values.
//
//   nlohmann::ordered_json v = nlohmann::ordered_json::parse(R"({"a":[1,2.5]})");
//   PyJsonDumps(v) == R"({"a": [1, 2.5]})";
//
// Thread-safe (pure functions).
#ifndef MMSERVE_MODEL_PY_JSON_H_
#define MMSERVE_MODEL_PY_JSON_H_

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mmserve::model {

std::string PyJsonDumps(const nlohmann::ordered_json& value);

// Parses `text` (key order kept) and writes it back with PyJsonDumps;
// InvalidArgument with the parser's reason when it is not JSON.
[[nodiscard]] absl::StatusOr<std::string> PyJsonReformat(absl::string_view text);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_PY_JSON_H_
