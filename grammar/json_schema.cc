#include <algorithm>
#include <cctype>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grammar/grammar.h"
#include "grammar/json_schema_converter.h"
#include "grammar/json_schema_text.h"

namespace mmserve::grammar {
namespace internal {
namespace {

constexpr size_t kMaxSchemaBytes = 64 * 1024;
constexpr int kMaxDepth = 32;

const std::set<std::string>& AnnotationSet() {
  static const auto* const kSet = new std::set<std::string>{
      "title",      "description", "default",   "examples", "$schema",     "$id",    "$comment",
      "deprecated", "readOnly",    "writeOnly", "$defs",    "definitions", "strict", "name"};
  return *kSet;
}

const std::set<std::string>& Supported() {
  static const auto* const kSet = new std::set<std::string>{"type",
                                                            "properties",
                                                            "required",
                                                            "additionalProperties",
                                                            "items",
                                                            "prefixItems",
                                                            "minItems",
                                                            "maxItems",
                                                            "enum",
                                                            "const",
                                                            "anyOf",
                                                            "oneOf",
                                                            "allOf",
                                                            "$ref",
                                                            "minLength",
                                                            "maxLength",
                                                            "pattern",
                                                            "format",
                                                            "minimum",
                                                            "maximum",
                                                            "exclusiveMinimum",
                                                            "exclusiveMaximum"};
  return *kSet;
}

}  // namespace

std::string JsonTypeOf(const Json& v) {
  return v.is_object()           ? "object"
         : v.is_array()          ? "array"
         : v.is_string()         ? "string"
         : v.is_number_integer() ? "integer"
         : v.is_number()         ? "number"
         : v.is_boolean()        ? "boolean"
                                 : "null";
}

bool IsAnnotation(const std::string& key) { return AnnotationSet().count(key) > 0; }

absl::StatusOr<std::string> SchemaConverter::Run(std::string_view text) {
  if (text.size() > kMaxSchemaBytes) {
    Fail("", absl::StrCat("the schema is larger than ", kMaxSchemaBytes / 1024, " KiB"));
    return error_;
  }
  Json::parser_callback_t no_callback = nullptr;
  root_ = Json::parse(text, no_callback, /*allow_exceptions=*/false);
  if (root_.is_discarded()) {
    Fail("", "the schema is not valid JSON");
    return error_;
  }
  std::string body = Visit(root_, "", 0);
  if (!error_.ok()) return error_;
  AddRule(p_ + "root", body);
  std::string out;
  for (const auto& [name, rule_body] : rules_) {
    absl::StrAppend(&out, name, " ::= ", rule_body, "\n");
  }
  return out;
}

void SchemaConverter::Fail(const std::string& path, std::string_view reason) {
  if (error_.ok()) {
    error_ = absl::InvalidArgumentError(absl::StrCat("json_schema: ", std::string(reason),
                                                     path.empty() ? "" : " (at ", path,
                                                     path.empty() ? "" : ")"));
  }
}

void SchemaConverter::AddRule(const std::string& name, std::string body) {
  rules_.push_back({name, std::move(body)});
}

// A fresh rule name for the node at `path`.
std::string SchemaConverter::NewName(std::string_view hint) {
  std::string name = absl::StrCat(p_, std::string(hint), "_", counter_++);
  return name;
}

std::string SchemaConverter::Ws() { return any_ws_ ? Basic("ws") : ""; }
std::string SchemaConverter::Sep() {
  return any_ws_ ? absl::StrCat(Basic("ws"), " \",\" ", Basic("ws")) : "\", \"";
}
std::string SchemaConverter::Colon() {
  return any_ws_ ? absl::StrCat(Basic("ws"), " \":\" ", Basic("ws")) : "\": \"";
}

// The shared rules: value, object, array, string, char, number, ...
std::string SchemaConverter::Basic(std::string_view what) {
  const std::string name = absl::StrCat(p_, "json_", std::string(what));
  if (basic_done_.insert(name).second) {
    const std::string n = absl::StrCat(p_, "json_");
    std::string body;
    if (what == "ws") body = "[ \\t\\n\\r]*";
    if (what == "char") {
      body =
          "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" "
          "([0-9a-cA-CeEfF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | "
          "[dD] [89abAB] [0-9a-fA-F]{2} \"\\\\u\" [dD] [c-fC-F] "
          "[0-9a-fA-F]{2}))";
    }
    if (what == "string") body = absl::StrCat("\"\\\"\" ", n, "char* \"\\\"\"");
    if (what == "integer") body = "\"-\"? (\"0\" | [1-9] [0-9]*)";
    if (what == "number") {
      body = absl::StrCat(n, "integer (\".\" [0-9]+)? ([eE] [+\\-]? [0-9]+)?");
      Basic("integer");
    }
    if (what == "boolean") body = "\"true\" | \"false\"";
    if (what == "null") body = "\"null\"";
    if (what == "value") {
      body = absl::StrCat(n, "object | ", n, "array | ", n, "string | ", n, "number | ", n,
                          "boolean | ", n, "null");
      for (auto k : {"object", "array", "string", "number", "boolean", "null"}) {
        Basic(k);
      }
    }
    if (what == "object") {
      body = absl::StrCat("\"{\" ", Ws(), " (", n, "string ", Colon(), " ", n, "value (", Sep(),
                          " ", n, "string ", Colon(), " ", n, "value)*)? ", Ws(), " \"}\"");
      Basic("string");
      Basic("value");
    }
    if (what == "array") {
      body = absl::StrCat("\"[\" ", Ws(), " (", n, "value (", Sep(), " ", n, "value)*)? ", Ws(),
                          " \"]\"");
      Basic("value");
    }
    if (what == "string") Basic("char");
    AddRule(name, body);
  }
  return name;
}

std::string SchemaConverter::Visit(const Json& s, const std::string& path, int depth) {
  if (!error_.ok()) return "";
  if (depth > kMaxDepth) {
    Fail(path, absl::StrCat("nesting is deeper than ", kMaxDepth));
    return "";
  }
  if (s.is_boolean()) {
    if (s.get<bool>()) return Basic("value");
    Fail(path, "the schema false matches nothing");
    return "";
  }
  if (!s.is_object()) {
    Fail(path, "a schema must be an object or a boolean");
    return "";
  }
  for (const auto& [key, value] : s.items()) {
    if (!Supported().count(key) && !IsAnnotation(key)) {
      Fail(path, absl::StrCat("keyword \"", key, "\" is not supported"));
      return "";
    }
  }
  if (s.contains("$ref")) return Ref(s, path, depth);
  for (const char* key : {"anyOf", "oneOf", "allOf"}) {
    if (s.contains(key)) return Combinator(s, key, path, depth);
  }
  if (s.contains("const")) return Values({s["const"]}, s, path);
  if (s.contains("enum")) {
    if (!s["enum"].is_array() || s["enum"].empty()) {
      Fail(path, "\"enum\" must be a non-empty array");
      return "";
    }
    return Values(std::vector<Json>(s["enum"].begin(), s["enum"].end()), s, path);
  }
  std::vector<std::string> types = Types(s, path);
  std::vector<std::string> alts;
  for (const std::string& type : types) {
    if (type == "object") alts.push_back(Object(s, path, depth));
    if (type == "array") alts.push_back(Array(s, path, depth));
    if (type == "string") alts.push_back(String(s, path));
    if (type == "integer") alts.push_back(Integer(s, path));
    if (type == "number") alts.push_back(Number(s, path));
    if (type == "boolean") alts.push_back(Basic("boolean"));
    if (type == "null") alts.push_back(Basic("null"));
  }
  return absl::StrCat("(", absl::StrJoin(alts, " | "), ")");
}

// The node's types: `type` (a name or an array of names), else inferred
// from its keywords, else every type.
std::vector<std::string> SchemaConverter::Types(const Json& s, const std::string& path) {
  static const std::set<std::string> kTypes = {"object", "array",   "string", "integer",
                                               "number", "boolean", "null"};
  std::vector<std::string> types;
  if (s.contains("type")) {
    const Json& t = s["type"];
    if (t.is_string()) types.push_back(t.get<std::string>());
    if (t.is_array()) {
      for (const Json& x : t) {
        if (x.is_string()) types.push_back(x.get<std::string>());
      }
    }
    if (types.empty() || types.size() != (t.is_array() ? t.size() : 1)) {
      Fail(path, "\"type\" must be a type name or an array of them");
    }
    for (const std::string& type : types) {
      if (!kTypes.count(type)) {
        Fail(path, absl::StrCat("unknown type \"", type, "\""));
      }
    }
    return types;
  }
  const auto has = [&](std::initializer_list<const char*> keys) {
    for (const char* k : keys) {
      if (s.contains(k)) return true;
    }
    return false;
  };
  if (has({"properties", "required", "additionalProperties"})) {
    types.push_back("object");
  }
  if (has({"items", "prefixItems", "minItems", "maxItems"})) {
    types.push_back("array");
  }
  if (has({"minLength", "maxLength", "pattern", "format"})) {
    types.push_back("string");
  }
  if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) {
    types.push_back("number");
  }
  if (types.empty()) {
    types = {"object", "array", "string", "number", "boolean", "null"};
  }
  return types;
}

bool SchemaConverter::HasValidationSiblings(const Json& s, std::string_view self) {
  for (const auto& [key, value] : s.items()) {
    if (key != self && !IsAnnotation(key)) return true;
  }
  return false;
}

std::string SchemaConverter::Ref(const Json& s, const std::string& path, int depth) {
  const Json& ref = s["$ref"];
  if (HasValidationSiblings(s, "$ref")) {
    Fail(path, "\"$ref\" together with other keywords is not supported");
    return "";
  }
  if (!ref.is_string()) {
    Fail(path, "\"$ref\" must be a string");
    return "";
  }
  const std::string target = ref.get<std::string>();
  if (auto it = ref_rules_.find(target); it != ref_rules_.end()) {
    return it->second;
  }
  const Json* node = ResolveRef(target);
  if (node == nullptr) {
    Fail(path, absl::StrCat("\"$ref\" \"", target,
                            "\" does not name a schema in \"$defs\" or \"definitions\""));
    return "";
  }
  const std::string def = target.substr(target.rfind('/') + 1);
  std::string hint;
  for (char c : def) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c));
    hint += ok ? c : '_';
  }
  const std::string name = NewName(absl::StrCat("ref_", hint));
  ref_rules_[target] = name;
  const std::string body = Visit(*node, target.substr(1), depth + 1);
  AddRule(name, body);
  return name;
}

const Json* SchemaConverter::ResolveRef(const std::string& target) const {
  if (target == "#") return &root_;
  for (const std::string dir : {"$defs", "definitions"}) {
    const std::string prefix = "#/" + dir + "/";
    if (target.rfind(prefix, 0) != 0) continue;
    const auto defs = root_.find(dir);
    if (defs == root_.end() || !defs->is_object()) return nullptr;
    const auto def = defs->find(target.substr(prefix.size()));
    return def == defs->end() ? nullptr : &*def;
  }
  return nullptr;
}

std::set<std::string> SchemaConverter::PossibleTypes(const Json& s, int depth) const {
  static const std::set<std::string> kAll = {"object", "array",   "string",
                                             "number", "boolean", "null"};
  if (!s.is_object() || depth > 8) return kAll;
  const auto value_types = [](const Json& values) {
    std::set<std::string> out;
    for (const Json& v : values) out.insert(JsonTypeOf(v) == "integer" ? "number" : JsonTypeOf(v));
    return out;
  };
  if (s.contains("$ref") && s["$ref"].is_string()) {
    const Json* node = ResolveRef(s["$ref"].get<std::string>());
    return node ? PossibleTypes(*node, depth + 1) : kAll;
  }
  if (s.contains("const")) return value_types(Json::array({s["const"]}));
  if (s.contains("enum") && s["enum"].is_array()) return value_types(s["enum"]);
  for (const char* key : {"anyOf", "oneOf", "allOf"}) {
    if (!s.contains(key) || !s[key].is_array()) continue;
    std::set<std::string> out;
    for (const Json& m : s[key]) {
      for (const std::string& t : PossibleTypes(m, depth + 1)) out.insert(t);
    }
    return out;
  }
  std::set<std::string> out;
  if (s.contains("type")) {
    const Json& t = s["type"];
    for (const Json& name : t.is_array() ? t : Json::array({t})) {
      if (!name.is_string()) return kAll;
      out.insert(name == "integer" ? "number" : name.get<std::string>());
    }
    return out;
  }
  for (std::string t : const_cast<SchemaConverter*>(this)->Types(s, "")) {
    out.insert(t == "integer" ? "number" : t);
  }
  return out;
}

// The const value of required property `key` of an object schema, if any.
static const Json* Discriminator(const Json& s, const std::string& key) {
  if (!s.is_object() || !s.contains("properties") || !s.contains("required")) return nullptr;
  const Json& props = s["properties"];
  const Json& required = s["required"];
  if (!props.is_object() || !required.is_array() || !props.contains(key)) return nullptr;
  if (std::find(required.begin(), required.end(), Json(key)) == required.end()) return nullptr;
  const Json& prop = props[key];
  return prop.is_object() && prop.contains("const") ? &prop["const"] : nullptr;
}

bool SchemaConverter::OneOfDisjoint(const Json& members) const {
  // Different JSON types cannot match the same document.
  std::set<std::string> seen;
  bool disjoint_types = true;
  for (const Json& m : members) {
    for (const std::string& t : PossibleTypes(m, 0)) disjoint_types &= seen.insert(t).second;
  }
  if (disjoint_types) return true;
  // Objects told apart by a required property with a different const each.
  if (!members[0].is_object() || !members[0].contains("properties") ||
      !members[0]["properties"].is_object()) {
    return false;
  }
  for (const auto& [key, unused] : members[0]["properties"].items()) {
    std::vector<Json> values;
    for (const Json& m : members) {
      const Json* v = Discriminator(m, key);
      if (v == nullptr || std::find(values.begin(), values.end(), *v) != values.end()) break;
      values.push_back(*v);
    }
    if (values.size() == members.size()) return true;
  }
  return false;
}

std::string SchemaConverter::Combinator(const Json& s, const std::string& key,
                                        const std::string& path, int depth) {
  const Json& members = s[key];
  if (HasValidationSiblings(s, key)) {
    Fail(path, absl::StrCat("\"", key,
                            "\" together with other keywords is not "
                            "supported"));
    return "";
  }
  if (!members.is_array() || members.empty()) {
    Fail(path, absl::StrCat("\"", key, "\" must be a non-empty array"));
    return "";
  }
  if (key == "oneOf" && !OneOfDisjoint(members)) {
    Fail(path,
         "\"oneOf\" is supported only when its schemas cannot match the same document "
         "(different types, or objects with a required property of different \"const\" "
         "values); use \"anyOf\"");
    return "";
  }
  if (key == "allOf" && members.size() != 1) {
    Fail(path, "\"allOf\" with more than one schema is not supported");
    return "";
  }
  std::vector<std::string> alts;
  for (size_t i = 0; i < members.size(); ++i) {
    alts.push_back(Visit(members[i], absl::StrCat(path, "/", key, "/", i), depth + 1));
  }
  return absl::StrCat("(", absl::StrJoin(alts, " | "), ")");
}

// const / enum: each value as compact JSON text, when it has the node's
// `type` (if any).
std::string SchemaConverter::Values(const std::vector<Json>& values, const Json& s,
                                    const std::string& path) {
  for (const auto& [key, value] : s.items()) {
    if (key != "enum" && key != "const" && key != "type" && !IsAnnotation(key)) {
      Fail(path, absl::StrCat("\"", key,
                              "\" together with \"enum\" or \"const\" is not "
                              "supported"));
      return "";
    }
  }
  std::set<std::string> types;
  if (s.contains("type")) {
    for (const std::string& t : Types(s, path)) types.insert(t);
  }
  std::vector<std::string> alts;
  for (const Json& v : values) {
    const std::string t = JsonTypeOf(v);
    const bool fits = types.empty() || types.count(t) || (t == "integer" && types.count("number"));
    if (fits) alts.push_back(EbnfLiteral(DumpJson(v)));
  }
  if (alts.empty()) {
    Fail(path, "no \"enum\" or \"const\" value has the given \"type\"");
    return "";
  }
  return absl::StrCat("(", absl::StrJoin(alts, " | "), ")");
}

}  // namespace internal

absl::StatusOr<std::string> JsonSchemaToEbnf(std::string_view schema_json, std::string_view prefix,
                                             bool any_whitespace, bool strict) {
  return internal::SchemaConverter(prefix, any_whitespace, strict).Run(schema_json);
}

}  // namespace mmserve::grammar
