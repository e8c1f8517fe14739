// Objects, arrays, strings and numbers of the JSON schema converter.
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "grammar/json_schema_converter.h"
#include "grammar/json_schema_text.h"
#include "grammar/regex_parser.h"

namespace mmserve::grammar::internal {
namespace {

constexpr int64_t kMaxCount = 1000;  // minItems, maxLength, ...
constexpr size_t kMaxPrefixItems = 64;

// Characters an object key may hold without escapes.
constexpr char kPlainChar[] = "[^\"\\\\\\x00-\\x1F]";

}  // namespace

std::optional<int64_t> SchemaConverter::Count(const Json& s, const char* key,
                                              const std::string& path) {
  if (!s.contains(key)) return std::nullopt;
  const Json& v = s[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0) {
    Fail(path, absl::StrCat("\"", key, "\" must be a non-negative integer"));
    return std::nullopt;
  }
  if (v.get<int64_t>() > kMaxCount) {
    Fail(path, absl::StrCat("\"", key, "\" above ", kMaxCount, " is not supported"));
    return std::nullopt;
  }
  return v.get<int64_t>();
}

std::string SchemaConverter::KeyNotIn(const std::vector<std::string>& keys) {
  // A trie over the keys' code points; each node's rule matches the rest of
  // a key (with its closing quote) that leaves the trie or ends off a key.
  struct Node {
    bool terminal = false;
    std::map<int32_t, std::unique_ptr<Node>> kids;
  };
  Node root;
  for (const std::string& key : keys) {
    Node* node = &root;
    bool plain = true;
    for (size_t pos = 0; pos < key.size() && plain;) {
      const int32_t cp = DecodeUtf8(key, pos);
      plain = cp >= 0x20 && cp != '"' && cp != '\\';
      if (!plain) break;
      auto& kid = node->kids[cp];
      if (!kid) kid = std::make_unique<Node>();
      node = kid.get();
    }
    // A key that needs escapes can never be written without them.
    if (plain) node->terminal = true;
  }
  const std::string plain = NewName("key_char");
  AddRule(plain, kPlainChar);
  std::function<std::string(const Node&)> rule = [&](const Node& node) {
    const std::string name = NewName("key");
    std::vector<std::string> alts;
    if (!node.terminal) alts.push_back("\"\\\"\"");
    std::string others = "[^\"\\\\\\x00-\\x1F";
    for (const auto& [cp, kid] : node.kids) {
      std::string ch;
      AppendUtf8(cp, ch);
      alts.push_back(absl::StrCat(EbnfLiteral(ch), " ", rule(*kid)));
      absl::StrAppend(&others, absl::StrFormat("\\U%08X", cp));
    }
    alts.push_back(absl::StrCat(others, "] ", plain, "* \"\\\"\""));
    AddRule(name, absl::StrJoin(alts, " | "));
    return name;
  };
  return absl::StrCat("\"\\\"\" ", rule(root));
}

std::string SchemaConverter::Object(const Json& s, const std::string& path, int depth) {
  static const Json kEmpty = Json::object();
  const Json& props = s.contains("properties") ? s["properties"] : kEmpty;
  if (!props.is_object()) {
    Fail(path, "\"properties\" must be an object");
    return "";
  }
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) Fail(path, "\"required\" must be an array");
    for (const Json& r : s["required"]) {
      if (!r.is_string()) {
        Fail(path, "\"required\" must hold strings");
        return "";
      }
      if (!props.contains(r.get<std::string>())) {
        Fail(path, absl::StrCat("required property \"", r.get<std::string>(),
                                "\" is not in \"properties\""));
        return "";
      }
      required.insert(r.get<std::string>());
    }
  }
  // Values of properties beyond `properties`: none, or this expression.
  std::string extra_value;
  if (!strict_) {
    const Json additional =
        s.contains("additionalProperties") ? s["additionalProperties"] : Json(true);
    if (additional.is_object()) {
      extra_value = Visit(additional, path + "/additionalProperties", depth + 1);
    } else if (!additional.is_boolean()) {
      Fail(path, "\"additionalProperties\" must be a boolean or a schema");
    } else if (additional.get<bool>()) {
      extra_value = Basic("value");
    }
  }
  std::vector<std::string> keys, kvs;
  std::vector<bool> optional;
  for (const auto& [key, schema] : props.items()) {
    const std::string value = Visit(schema, absl::StrCat(path, "/properties/", key), depth + 1);
    keys.push_back(key);
    kvs.push_back(absl::StrCat(EbnfLiteral(DumpJson(key)), " ", Colon(), " (", value, ")"));
    optional.push_back(required.count(key) == 0);
  }
  if (!error_.ok()) return "";
  const std::string name = NewName("object");
  // after_i: the rest once something was written, from property i on;
  // first_i: the same before anything was written.
  std::string after = "\"\"", first = "\"\"";
  if (!extra_value.empty()) {
    const std::string extra = NewName("extra");
    AddRule(extra, absl::StrCat(KeyNotIn(keys), " ", Colon(), " (", extra_value, ")"));
    after = absl::StrCat("(", Sep(), " ", extra, ")*");
    first = absl::StrCat("(", extra, " ", after, ")?");
  }
  for (size_t i = keys.size(); i-- > 0;) {
    const std::string a = absl::StrCat(name, "_a", i);
    const std::string f = absl::StrCat(name, "_f", i);
    AddRule(a, absl::StrCat(Sep(), " ", kvs[i], " ", after,
                            optional[i] ? absl::StrCat(" | ", after) : ""));
    AddRule(f, absl::StrCat(kvs[i], " ", after, optional[i] ? absl::StrCat(" | ", first) : ""));
    after = a;
    first = f;
  }
  AddRule(name, absl::StrCat("\"{\" ", Ws(), " ", first, " ", Ws(), " \"}\""));
  return name;
}

std::string SchemaConverter::Array(const Json& s, const std::string& path, int depth) {
  std::vector<std::string> prefix;
  if (s.contains("prefixItems")) {
    const Json& items = s["prefixItems"];
    if (!items.is_array()) {
      Fail(path, "\"prefixItems\" must be an array");
      return "";
    }
    if (items.size() > kMaxPrefixItems) {
      Fail(path, absl::StrCat("\"prefixItems\" with more than ", kMaxPrefixItems,
                              " schemas is not supported"));
      return "";
    }
    for (size_t i = 0; i < items.size(); ++i) {
      prefix.push_back(Visit(items[i], absl::StrCat(path, "/prefixItems/", i), depth + 1));
    }
  }
  std::string item = Basic("value");  // "" when no more items are allowed
  if (s.contains("items")) {
    const Json& items = s["items"];
    if (items.is_array()) {
      Fail(path, "\"items\" as an array is not supported; use \"prefixItems\"");
      return "";
    }
    if (items.is_boolean()) {
      if (!items.get<bool>()) item.clear();
    } else {
      item = Visit(items, path + "/items", depth + 1);
    }
  }
  const int64_t k = static_cast<int64_t>(prefix.size());
  const int64_t min = Count(s, "minItems", path).value_or(0);
  std::optional<int64_t> max = Count(s, "maxItems", path);
  if (item.empty()) max = std::min(max.value_or(k), k);
  if (!error_.ok()) return "";
  if (max && min > *max) {
    Fail(path, "\"minItems\" is above the number of items allowed");
    return "";
  }
  const auto element = [&](int64_t i) { return absl::StrCat("(", i < k ? prefix[i] : item, ")"); };
  // What follows once i elements were written, from i = last down: the
  // prefix items one by one (nested: each only after the one before), then
  // `item` repeated.
  const int64_t last = std::min(std::max(k, int64_t{1}), max.value_or(INT64_MAX));
  std::string tail = "\"\"";
  if (!max || *max > last) {
    tail = absl::StrCat("(", Sep(), " ", element(last), "){", std::max<int64_t>(0, min - last), ",",
                        max ? std::to_string(*max - last) : "", "}");
  }
  for (int64_t i = last; i-- > 1;) {
    const std::string next = absl::StrCat(Sep(), " ", element(i), " ", tail);
    tail = i < min ? next : absl::StrCat("(", next, ")?");
  }
  std::vector<std::string> alts;
  if (min == 0) alts.push_back(absl::StrCat("\"[\" ", Ws(), " \"]\""));
  if (!max || *max >= 1) {
    alts.push_back(absl::StrCat("\"[\" ", Ws(), " ", element(0), " ", tail, " ", Ws(), " \"]\""));
  }
  const std::string name = NewName("array");
  AddRule(name, absl::StrJoin(alts, " | "));
  return name;
}

std::string SchemaConverter::String(const Json& s, const std::string& path) {
  const std::string quote = "\"\\\"\"";
  const bool has_length = s.contains("minLength") || s.contains("maxLength");
  if (s.contains("format")) {
    if (has_length || s.contains("pattern")) {
      Fail(path,
           "\"format\" together with \"pattern\", \"minLength\" or "
           "\"maxLength\" is not supported");
      return "";
    }
    if (!s["format"].is_string()) {
      Fail(path, "\"format\" must be a string");
      return "";
    }
    const std::string format = s["format"].get<std::string>();
    absl::StatusOr<std::string> body = FormatEbnf(format);
    if (!body.ok()) {
      Fail(path, absl::StrCat("format \"", format,
                              "\" is not supported (supported: date, time, "
                              "date-time, uuid, email)"));
      return "";
    }
    return absl::StrCat(quote, " ", *body, " ", quote);
  }
  if (s.contains("pattern")) {
    if (has_length) {
      Fail(path,
           "\"pattern\" together with \"minLength\" or \"maxLength\" is "
           "not supported");
      return "";
    }
    if (!s["pattern"].is_string()) {
      Fail(path, "\"pattern\" must be a string");
      return "";
    }
    absl::StatusOr<ParsedRegex> regex = ParseRegex(s["pattern"].get<std::string>());
    if (!regex.ok()) {
      Fail(path, absl::StrCat("\"pattern\": ", regex.status().message()));
      return "";
    }
    // A pattern matches anywhere in the string unless anchored.
    const std::string any = absl::StrCat(Basic("char"), "*");
    return absl::StrCat(quote, " ", regex->anchored_start ? "" : any, " ",
                        JsonEscapedEbnf(regex->expr), " ", regex->anchored_end ? "" : any, " ",
                        quote);
  }
  if (has_length) {
    const int64_t min = Count(s, "minLength", path).value_or(0);
    const std::optional<int64_t> max = Count(s, "maxLength", path);
    if (max && min > *max) Fail(path, "\"minLength\" is above \"maxLength\"");
    if (!error_.ok()) return "";
    return absl::StrCat(quote, " ", Basic("char"), "{", min, ",", max ? std::to_string(*max) : "",
                        "} ", quote);
  }
  return Basic("string");
}

std::string SchemaConverter::Integer(const Json& s, const std::string& path) {
  std::optional<int64_t> lo, hi;
  const auto bound = [&](const char* key, bool lower, bool exclusive) {
    if (!s.contains(key)) return;
    const Json& v = s[key];
    if (!v.is_number() || std::abs(v.get<double>()) > 9e18) {
      Fail(path, absl::StrCat("\"", key, "\" must be a number within 9e18"));
      return;
    }
    const double x = v.get<double>();
    int64_t b = v.is_number_integer() ? v.get<int64_t>()
                                      : static_cast<int64_t>(lower ? std::ceil(x) : std::floor(x));
    if (exclusive && static_cast<double>(b) == x) b += lower ? 1 : -1;
    std::optional<int64_t>& slot = lower ? lo : hi;
    slot = !slot ? b : lower ? std::max(*slot, b) : std::min(*slot, b);
  };
  bound("minimum", true, false);
  bound("exclusiveMinimum", true, true);
  bound("maximum", false, false);
  bound("exclusiveMaximum", false, true);
  if (!error_.ok()) return "";
  if (!lo && !hi) return Basic("integer");
  absl::StatusOr<std::string> range = IntegerRangeEbnf(lo, hi);
  if (!range.ok()) {
    Fail(path, "no integer lies between the bounds");
    return "";
  }
  return *range;
}

std::string SchemaConverter::Number(const Json& s, const std::string& path) {
  bool bounded = false;
  for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
    bounded |= s.contains(key);
  }
  if (!bounded) return Basic("number");
  if (s.size() > 0 && s.contains("minimum") && s["minimum"].is_number() &&
      s["minimum"].get<double>() == 0 && !s.contains("maximum") &&
      !s.contains("exclusiveMinimum") && !s.contains("exclusiveMaximum")) {
    return "(\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [+\\-]? [0-9]+)?";
  }
  Fail(path,
       "bounds on a number are supported only as \"minimum\": 0; use "
       "\"type\": \"integer\" for other bounds");
  return "";
}

}  // namespace mmserve::grammar::internal
