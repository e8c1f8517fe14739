#include "router/openai_tools.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mmserve::router::openai_tools {
namespace {

using openai_fields::FieldError;
using openai_fields::Find;
using openai_fields::GetBool;
using openai_fields::GetString;
using openai_fields::json;
using ToolChoice = mmserve::v1::ToolChoice;

// obj["type"] must be "function" (the only kind of tool), or absent.
absl::Status CheckFunctionType(const json& obj, const std::string& field) {
  const json* type = Find(obj, "type");
  if (type == nullptr) return FieldError(field + ".type", "missing");
  ASSIGN_OR_RETURN(std::string t, GetString(*type, field + ".type"));
  if (t != "function") {
    return FieldError(field + ".type", absl::StrCat("\"", t, "\" is not supported (function)"));
  }
  return absl::OkStatus();
}

// obj["function"], which must be an object.
absl::StatusOr<const json*> FunctionOf(const json& obj, const std::string& field) {
  const json* f = Find(obj, "function");
  if (f == nullptr) return FieldError(field + ".function", "missing");
  if (!f->is_object()) return FieldError(field + ".function", "must be an object");
  return f;
}

// `ordered` is the same tool read with its keys in the body's order.
absl::Status ParseTool(const json& tool, const nlohmann::ordered_json& ordered,
                       const std::string& field, mmserve::v1::Tool* out) {
  if (!tool.is_object()) return FieldError(field, "must be an object");
  RETURN_IF_ERROR(CheckFunctionType(tool, field));
  ASSIGN_OR_RETURN(const json* f, FunctionOf(tool, field));
  mmserve::v1::FunctionDefinition* def = out->mutable_function();
  const json* name = Find(*f, "name");
  if (name == nullptr) return FieldError(field + ".function.name", "missing");
  ASSIGN_OR_RETURN(*def->mutable_name(), GetString(*name, field + ".function.name"));
  if (const json* d = Find(*f, "description")) {
    ASSIGN_OR_RETURN(*def->mutable_description(), GetString(*d, field + ".function.description"));
  }
  if (const json* p = Find(*f, "parameters")) {
    if (!p->is_object()) return FieldError(field + ".function.parameters", "must be an object");
    // The schema is shown to the model with the client's key order.
    def->set_parameters(ordered["function"]["parameters"].dump());
  }
  return absl::OkStatus();
}

absl::Status ParseToolChoice(const json& v, ToolChoice* out) {
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s == "none") return out->set_mode(ToolChoice::MODE_NONE), absl::OkStatus();
    if (s == "auto") return out->set_mode(ToolChoice::MODE_AUTO), absl::OkStatus();
    if (s == "required") return out->set_mode(ToolChoice::MODE_REQUIRED), absl::OkStatus();
    return FieldError("tool_choice",
                      absl::StrCat("\"", s, "\" is not none, auto, required or a function"));
  }
  if (!v.is_object()) {
    return FieldError("tool_choice",
                      "must be \"none\", \"auto\", \"required\" or {\"type\": "
                      "\"function\", \"function\": {\"name\": ...}}");
  }
  RETURN_IF_ERROR(CheckFunctionType(v, "tool_choice"));
  ASSIGN_OR_RETURN(const json* f, FunctionOf(v, "tool_choice"));
  const json* name = Find(*f, "name");
  if (name == nullptr) return FieldError("tool_choice.function.name", "missing");
  ASSIGN_OR_RETURN(*out->mutable_function_name(), GetString(*name, "tool_choice.function.name"));
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseTools(const json& body, absl::string_view body_text, mmserve::v1::Chat* chat) {
  if (const json* tools = Find(body, "tools")) {
    if (!tools->is_array()) return FieldError("tools", "must be an array");
    // `body` (nlohmann::json) sorts keys; the body's text keeps their order.
    nlohmann::ordered_json ordered;
    if (!tools->empty()) {
      ordered = nlohmann::ordered_json::parse(body_text, nullptr, /*allow_exceptions=*/false);
      if (ordered.is_discarded()) return FieldError("tools", "is not valid JSON");
    }
    for (size_t t = 0; t < tools->size(); ++t) {
      RETURN_IF_ERROR(ParseTool((*tools)[t], ordered["tools"][t], absl::StrCat("tools[", t, "]"),
                                chat->add_tools()));
    }
  }
  if (const json* v = Find(body, "tool_choice")) {
    RETURN_IF_ERROR(ParseToolChoice(*v, chat->mutable_tool_choice()));
  }
  if (const json* v = Find(body, "parallel_tool_calls")) {
    ASSIGN_OR_RETURN(bool parallel, GetBool(*v, "parallel_tool_calls"));
    chat->set_parallel_tool_calls(parallel);
  }
  return absl::OkStatus();
}

absl::Status ParseMessageToolFields(const json& m, const std::string& field,
                                    const std::string& role, mmserve::v1::ChatMessage* out) {
  if (const json* id = Find(m, "tool_call_id")) {
    ASSIGN_OR_RETURN(*out->mutable_tool_call_id(), GetString(*id, field + ".tool_call_id"));
  }
  const json* calls = Find(m, "tool_calls");
  if (calls == nullptr) return absl::OkStatus();
  if (!calls->is_array()) return FieldError(field + ".tool_calls", "must be an array");
  for (size_t c = 0; c < calls->size(); ++c) {
    const std::string call_field = absl::StrCat(field, ".tool_calls[", c, "]");
    const json& call = (*calls)[c];
    if (!call.is_object()) return FieldError(call_field, "must be an object");
    mmserve::v1::ToolCall* tc = out->add_tool_calls();
    if (const json* id = Find(call, "id")) {
      ASSIGN_OR_RETURN(*tc->mutable_id(), GetString(*id, call_field + ".id"));
    }
    RETURN_IF_ERROR(CheckFunctionType(call, call_field));
    ASSIGN_OR_RETURN(const json* f, FunctionOf(call, call_field));
    const json* name = Find(*f, "name");
    if (name == nullptr) return FieldError(call_field + ".function.name", "missing");
    ASSIGN_OR_RETURN(*tc->mutable_name(), GetString(*name, call_field + ".function.name"));
    const json* args = Find(*f, "arguments");
    if (args == nullptr) return FieldError(call_field + ".function.arguments", "missing");
    ASSIGN_OR_RETURN(*tc->mutable_arguments(),
                     GetString(*args, call_field + ".function.arguments"));
  }
  return absl::OkStatus();
}

}  // namespace mmserve::router::openai_tools
