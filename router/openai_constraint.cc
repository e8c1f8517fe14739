// openai_fields::ParseConstraint: structured output on the OpenAI endpoints
// (OpenAI's response_format, vLLM's guided_json / guided_regex /
// guided_grammar) as SamplingParams.constraint, parsed without a vocabulary
// so a bad schema is a 400 here, with the reason.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grammar/grammar.h"
#include "router/openai_fields.h"

namespace mmserve::router::openai_fields {
namespace {

using mmserve::v1::OutputConstraint;
using mmserve::v1::SamplingParams;

// A schema's text with its keys in the order the client wrote them (the
// order the output's properties follow): the body parsed again, keeping
// only `top_key` (`nested` below it).
absl::StatusOr<std::string> OrderedSchemaText(absl::string_view raw_body, const char* top_key,
                                              std::vector<std::string> nested) {
  const nlohmann::ordered_json::parser_callback_t keep_top =
      [top_key](int depth, nlohmann::ordered_json::parse_event_t event,
                nlohmann::ordered_json& parsed) {
        // Other top-level fields (messages, images) are skipped, not built.
        return !(depth == 1 && event == nlohmann::ordered_json::parse_event_t::key &&
                 parsed != top_key);
      };
  nlohmann::ordered_json doc =
      nlohmann::ordered_json::parse(raw_body.begin(), raw_body.end(), keep_top,
                                    /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InternalError("the body did not parse again");
  const nlohmann::ordered_json* v = &doc[top_key];
  for (const std::string& key : nested) v = &(*v)[key];
  return v->is_string() ? v->get<std::string>() : v->dump();
}

// grammar::Validate's reason for `spec`, reported on `field` (the library
// names the kind first: "json_schema: ..."; the client knows the field).
absl::Status CheckSpec(const grammar::ConstraintSpec& spec, absl::string_view field) {
  const absl::Status valid = grammar::Validate(spec);
  if (valid.ok()) return valid;
  absl::string_view reason = valid.message();
  if (const size_t colon = reason.find(": ");
      colon != absl::string_view::npos && colon < 16 &&
      reason.substr(0, colon).find(' ') == absl::string_view::npos) {
    reason.remove_prefix(colon + 2);
  }
  return FieldError(field, reason);
}

// response_format: {"type": "text" | "json_object" | "json_schema",
// "json_schema": {"name", "description", "schema", "strict"}}.
absl::Status ParseResponseFormat(const json& v, absl::string_view raw_body, OutputConstraint* c,
                                 bool* set) {
  if (!v.is_object()) return FieldError("response_format", "must be an object");
  const json* type = Find(v, "type");
  if (type == nullptr) return FieldError("response_format.type", "missing");
  ASSIGN_OR_RETURN(const std::string t, GetString(*type, "response_format.type"));
  if (t == "text") return absl::OkStatus();
  if (t == "json_object") {
    c->set_json_object(true);
    *set = true;
    return CheckSpec({grammar::ConstraintSpec::Kind::kJsonObject, ""}, "response_format");
  }
  if (t != "json_schema") {
    return FieldError("response_format.type",
                      "must be \"text\", \"json_object\" or \"json_schema\"");
  }
  const json* js = Find(v, "json_schema");
  if (js == nullptr) return FieldError("response_format.json_schema", "missing");
  if (!js->is_object()) return FieldError("response_format.json_schema", "must be an object");
  const json* name = Find(*js, "name");
  if (name == nullptr) return FieldError("response_format.json_schema.name", "missing");
  ASSIGN_OR_RETURN(const std::string n, GetString(*name, "response_format.json_schema.name"));
  if (n.empty() || n.size() > 64 || !std::all_of(n.begin(), n.end(), [](char ch) {
        return absl::ascii_isalnum(ch) || ch == '_' || ch == '-';
      })) {
    return FieldError("response_format.json_schema.name",
                      "must be 1 to 64 letters, digits, underscores or dashes");
  }
  *set = true;
  const json* schema = Find(*js, "schema");
  if (schema == nullptr) {  // OpenAI: any object
    c->set_json_object(true);
    return absl::OkStatus();
  }
  if (!schema->is_object()) {
    return FieldError("response_format.json_schema.schema", "must be a JSON schema object");
  }
  ASSIGN_OR_RETURN(std::string text,
                   OrderedSchemaText(raw_body, "response_format", {"json_schema", "schema"}));
  bool strict = false;
  if (const json* s = Find(*js, "strict")) {
    ASSIGN_OR_RETURN(strict, GetBool(*s, "response_format.json_schema.strict"));
  }
  c->set_json_schema(text);
  c->set_strict(strict);
  return CheckSpec({grammar::ConstraintSpec::Kind::kJsonSchema, std::move(text), strict},
                   "response_format.json_schema.schema");
}

}  // namespace

absl::Status ParseConstraint(const json& body, absl::string_view raw_body, SamplingParams* s) {
  OutputConstraint c;
  std::vector<std::string> given;  // the fields that set a constraint
  if (const json* v = Find(body, "response_format")) {
    bool set = false;
    RETURN_IF_ERROR(ParseResponseFormat(*v, raw_body, &c, &set));
    if (set) given.push_back("response_format");
  }
  if (const json* v = Find(body, "guided_json")) {
    // vLLM's: a schema as an object or as JSON text.
    if (!v->is_object() && !v->is_string()) {
      return FieldError("guided_json", "must be a JSON schema (an object or its JSON text)");
    }
    ASSIGN_OR_RETURN(std::string text, OrderedSchemaText(raw_body, "guided_json", {}));
    RETURN_IF_ERROR(CheckSpec({grammar::ConstraintSpec::Kind::kJsonSchema, text}, "guided_json"));
    c.set_json_schema(std::move(text));
    given.push_back("guided_json");
  }
  for (const auto& [key, kind] : {std::pair<const char*, grammar::ConstraintSpec::Kind>{
                                      "guided_regex", grammar::ConstraintSpec::Kind::kRegex},
                                  {"guided_grammar", grammar::ConstraintSpec::Kind::kEbnf}}) {
    const json* v = Find(body, key);
    if (v == nullptr) continue;
    ASSIGN_OR_RETURN(std::string text, GetString(*v, key));
    RETURN_IF_ERROR(CheckSpec({kind, text}, key));
    if (kind == grammar::ConstraintSpec::Kind::kRegex) {
      c.set_regex(std::move(text));
    } else {
      c.set_grammar(std::move(text));
    }
    given.push_back(key);
  }
  if (given.size() > 1) {
    return FieldError(given[1],
                      absl::StrCat("give one output constraint; ", given[0], " is given too"));
  }
  if (!given.empty()) *s->mutable_constraint() = std::move(c);
  return absl::OkStatus();
}

}  // namespace mmserve::router::openai_fields
