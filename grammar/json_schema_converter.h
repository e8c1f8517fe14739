// The JSON schema converter behind JsonSchemaToEbnf. json_schema.cc holds
// the node dispatch, $ref and combinators; json_schema_types.cc objects,
// arrays, strings and numbers. Each node becomes an EBNF expression;
// objects, arrays and $ref targets get rules of their own.
#ifndef MMSERVE_GRAMMAR_JSON_SCHEMA_CONVERTER_H_
#define MMSERVE_GRAMMAR_JSON_SCHEMA_CONVERTER_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace mmserve::grammar::internal {

using Json = nlohmann::ordered_json;

// "object", "array", "string", "integer", "number", "boolean" or "null".
std::string JsonTypeOf(const Json& value);

// Keywords that do not change which documents are valid.
bool IsAnnotation(const std::string& key);

class SchemaConverter {
 public:
  SchemaConverter(std::string_view prefix, bool any_ws, bool strict)
      : p_(prefix), any_ws_(any_ws), strict_(strict) {}

  absl::StatusOr<std::string> Run(std::string_view text);

 private:
  // Records the first error (InvalidArgument naming `path`).
  void Fail(const std::string& path, std::string_view reason);
  void AddRule(const std::string& name, std::string body);
  std::string NewName(std::string_view hint);
  // A shared rule ("value", "object", "string", "char", "number", ...),
  // emitted on first use; returns its name.
  std::string Basic(std::string_view what);
  std::string Ws();     // between tokens: "" or any JSON whitespace
  std::string Sep();    // between items
  std::string Colon();  // between a key and its value

  std::string Visit(const Json& s, const std::string& path, int depth);
  std::vector<std::string> Types(const Json& s, const std::string& path);
  bool HasValidationSiblings(const Json& s, std::string_view self);
  std::string Ref(const Json& s, const std::string& path, int depth);
  // The schema a "$ref" names ("#", "#/$defs/x", "#/definitions/x"), or null.
  const Json* ResolveRef(const std::string& target) const;
  // The JSON types a schema may match ("integer" counted as "number").
  std::set<std::string> PossibleTypes(const Json& s, int depth) const;
  // No document can match two of `members` (the cheap cases only).
  bool OneOfDisjoint(const Json& members) const;
  std::string Combinator(const Json& s, const std::string& key, const std::string& path, int depth);
  std::string Values(const std::vector<Json>& values, const Json& s, const std::string& path);
  std::string Object(const Json& s, const std::string& path, int depth);
  std::string Array(const Json& s, const std::string& path, int depth);
  std::string String(const Json& s, const std::string& path);
  std::string Integer(const Json& s, const std::string& path);
  std::string Number(const Json& s, const std::string& path);
  // A non-negative integer keyword (minItems, maxLength, ...), if present.
  std::optional<int64_t> Count(const Json& s, const char* key, const std::string& path);
  // A quoted object key that is none of `keys` (written without escapes).
  std::string KeyNotIn(const std::vector<std::string>& keys);

  const std::string p_;
  const bool any_ws_;
  const bool strict_;
  Json root_;
  absl::Status error_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> basic_done_;
  absl::flat_hash_map<std::string, std::string> ref_rules_;
  int counter_ = 0;
};

}  // namespace mmserve::grammar::internal

#endif  // MMSERVE_GRAMMAR_JSON_SCHEMA_CONVERTER_H_
