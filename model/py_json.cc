#include "model/py_json.h"

#include "absl/strings/str_cat.h"

namespace mmserve::model {
namespace {

using json = nlohmann::ordered_json;

void Append(const json& v, std::string* out) {
  switch (v.type()) {
    case json::value_t::object: {
      *out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) *out += ", ";
        first = false;
        // nlohmann escapes strings as json.dumps does without ensure_ascii:
        // \" \\ \b \f \n \r \t, other control characters as \u00xx.
        *out += json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace);
        *out += ": ";
        Append(it.value(), out);
      }
      *out += '}';
      return;
    }
    case json::value_t::array: {
      *out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i > 0) *out += ", ";
        Append(v[i], out);
      }
      *out += ']';
      return;
    }
    default:
      *out += v.dump(-1, ' ', false, json::error_handler_t::replace);
  }
}

}  // namespace

std::string PyJsonDumps(const json& value) {
  std::string out;
  Append(value, &out);
  return out;
}

absl::StatusOr<std::string> PyJsonReformat(absl::string_view text) {
  json v = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return absl::InvalidArgumentError("is not valid JSON");
  return PyJsonDumps(v);
}

}  // namespace mmserve::model
