#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/grammar_testing.h"
#include "grammar/schema_corpus.h"
#include "nlohmann/json.hpp"

namespace mmserve::grammar {
namespace {

using testing::Matches;
using testing::MustCompile;

std::shared_ptr<const CompiledGrammar> Schema(const std::string& schema, bool strict = false) {
  return MustCompile({ConstraintSpec::Kind::kJsonSchema, schema, strict});
}

std::string ErrorOf(const std::string& schema) {
  return std::string(Validate({ConstraintSpec::Kind::kJsonSchema, schema}).message());
}

// `text` split greedily into the vocabulary's longest tokens.
std::vector<int32_t> Tokenize(const std::string& text, const Vocabulary& v) {
  std::vector<int32_t> out;
  for (size_t pos = 0; pos < text.size();) {
    int32_t best = static_cast<uint8_t>(text[pos]);  // byte tokens
    for (int32_t t = 256; t < v.size(); ++t) {
      const std::string& b = v.bytes(t);
      if (!v.is_special(t) && !v.is_eos(t) && b.size() > v.bytes(best).size() &&
          text.compare(pos, b.size(), b) == 0) {
        best = t;
      }
    }
    out.push_back(best);
    pos += v.bytes(best).size();
  }
  return out;
}

// JSON text per RFC 8259. nlohmann refuses numbers beyond a double's range
// (1e400), which the grammar allows as JSON does.
bool ParsesAsJson(const std::string& doc) {
  try {
    return !nlohmann::json::parse(doc).is_discarded();
  } catch (const nlohmann::json::out_of_range& e) {
    return e.id == 406;  // number overflow
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

TEST_CASE(
    "schema corpus: valid documents are accepted byte by byte and "
    "token by token, the others rejected") {
  auto vocab = testing::RandomVocabulary(5, 400);
  for (const testing::SchemaCase& c : testing::LoadSchemaCorpus(testing::kCorpusPath)) {
    INFO(c.name);
    auto g = Schema(c.schema, c.strict);
    auto gv = MustCompile({ConstraintSpec::Kind::kJsonSchema, c.schema, c.strict}, vocab);
    for (const std::string& doc : c.valid) {
      INFO(doc);
      CHECK(Matches(g, doc));
      Matcher m(gv);
      for (int32_t t : Tokenize(doc, *vocab)) REQUIRE(m.AcceptToken(t));
      CHECK(m.AcceptToken(vocab->eos()[0]));
    }
    for (const std::string& doc : c.invalid) {
      INFO(doc);
      CHECK_FALSE(Matches(g, doc));
    }
    for (const std::string& doc : c.refused_valid) {
      INFO(doc);
      CHECK_FALSE(Matches(g, doc));
    }
  }
}

TEST_CASE("schema corpus: random walks end in JSON documents") {
  auto vocab = testing::RandomVocabulary(9, 300);
  std::mt19937 rng(3);
  for (const testing::SchemaCase& c : testing::LoadSchemaCorpus(testing::kCorpusPath)) {
    INFO(c.name);
    auto g = MustCompile({ConstraintSpec::Kind::kJsonSchema, c.schema, c.strict}, vocab);
    int finished = 0;
    for (int i = 0; i < 10; ++i) {
      const auto doc = testing::RandomWalk(Matcher(g), *vocab, rng, 300, 0.5);
      if (!doc) continue;
      ++finished;
      INFO(*doc);
      CHECK(ParsesAsJson(*doc));
      CHECK(Matches(Schema(c.schema, c.strict), *doc));
    }
    CHECK(finished >= 3);
  }
}

TEST_CASE("json_object accepts any object and nothing else") {
  auto g = MustCompile({ConstraintSpec::Kind::kJsonObject, ""});
  CHECK(Matches(g, "{}"));
  CHECK(Matches(g, R"({"a": [1, {"b": null}], "c": "\u00e9"})"));
  Matcher m(g);
  REQUIRE(m.AcceptBytes(R"({"a": 1)"));
  CHECK_FALSE(m.CanTerminate());
  REQUIRE(m.AcceptBytes("}"));
  CHECK(m.IsFinished());  // nothing may follow the object but eos
  CHECK_FALSE(Matches(g, "[]"));
  CHECK_FALSE(Matches(g, "1"));
  CHECK_FALSE(Matches(g, R"({"a": 1,})"));
  CHECK_FALSE(Matches(g, R"({"a": "\ud800"})"));  // a lone surrogate
  CHECK(Matches(g, R"({"a": "\ud83d\ude42"})"));
  CHECK_FALSE(Matches(g, "{\"a\": \"\xC3\"}"));  // invalid UTF-8
}

TEST_CASE("json_object nests up to the stack limit") {
  auto g = MustCompile({ConstraintSpec::Kind::kJsonObject, ""});
  const auto nested = [](int depth) {
    return "{\"a\": " + std::string(depth, '[') + std::string(depth, ']') + "}";
  };
  CHECK(Matches(g, nested(200)));
  CHECK_FALSE(Matches(g, nested(2000)));
}

TEST_CASE("any_whitespace allows JSON whitespace between tokens") {
  auto ebnf = JsonSchemaToEbnf(
      R"({"type": "object", "properties": {"a": {"type": "array"}},
          "required": ["a"], "additionalProperties": false})",
      "", /*any_whitespace=*/true);
  REQUIRE(ebnf.ok());
  auto g = MustCompile({ConstraintSpec::Kind::kEbnf, *ebnf});
  CHECK(Matches(g, "{\n  \"a\" : [ 1 ,2 ]\n}"));
  CHECK(Matches(g, R"({"a":[]})"));
  CHECK_FALSE(Matches(g, R"({"a": [], })"));
}

TEST_CASE("prefixed schemas compose in one grammar") {
  auto a = JsonSchemaToEbnf(R"({"type": "integer"})", "a_");
  auto b = JsonSchemaToEbnf(R"({"type": "array", "items": {"type": "string"}})", "b_");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->find("a_root ::=") != std::string::npos);
  auto g = MustCompile({ConstraintSpec::Kind::kEbnf, "root ::= a_root \" \" b_root\n" + *a + *b});
  CHECK(Matches(g, R"(12 ["x", "y"])"));
  CHECK_FALSE(Matches(g, R"(12 [1])"));
}

TEST_CASE("unsupported keywords and bad schemas are refused with reasons") {
  CHECK(ErrorOf(R"({"type": "object", "patternProperties": {}})") ==
        "json_schema: keyword \"patternProperties\" is not supported");
  CHECK(ErrorOf(R"({"properties": {"a": {"not": {}}}})") ==
        "json_schema: keyword \"not\" is not supported (at /properties/a)");
  CHECK(ErrorOf(R"({"type": "array", "uniqueItems": true})") ==
        "json_schema: keyword \"uniqueItems\" is not supported");
  CHECK(ErrorOf(R"({"type": "string", "format": "uri"})") ==
        "json_schema: format \"uri\" is not supported (supported: date, "
        "time, date-time, uuid, email)");
  CHECK(ErrorOf(R"({"type": "number", "maximum": 3.5})") ==
        "json_schema: bounds on a number are supported only as \"minimum\": "
        "0; use \"type\": \"integer\" for other bounds");
  CHECK(ErrorOf(R"({"type": "string", "pattern": "(a"})") ==
        "json_schema: \"pattern\": regex: unbalanced ( at 0");
  CHECK(ErrorOf(R"({"$ref": "#/$defs/missing"})") ==
        "json_schema: \"$ref\" \"#/$defs/missing\" does not name a schema in "
        "\"$defs\" or \"definitions\"");
  CHECK(ErrorOf(R"({"allOf": [{}, {}]})") ==
        "json_schema: \"allOf\" with more than one schema is not supported");
  CHECK(ErrorOf(R"({"type": "strin"})") == "json_schema: unknown type \"strin\"");
  CHECK(ErrorOf(R"({"properties": {}, "required": ["x"]})") ==
        "json_schema: required property \"x\" is not in \"properties\"");
  CHECK(ErrorOf(R"({"type": "integer", "minimum": 5, "maximum": 4})") ==
        "json_schema: no integer lies between the bounds");
  CHECK(ErrorOf(R"({"type": "array", "minItems": 3, "maxItems": 2})") ==
        "json_schema: \"minItems\" is above the number of items allowed");
  CHECK(ErrorOf(R"({"type": "string", "maxLength": 5000})") ==
        "json_schema: \"maxLength\" above 1000 is not supported");
  CHECK(ErrorOf("{\"type\": ") == "json_schema: the schema is not valid JSON");
  CHECK(ErrorOf("false") == "json_schema: the schema false matches nothing");
  CHECK(ErrorOf(R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})") ==
        "json_schema: \"oneOf\" is supported only when its schemas cannot match the same "
        "document (different types, or objects with a required property of different "
        "\"const\" values); use \"anyOf\"");
  CHECK(ErrorOf(R"({"$defs": {"a": {"type": "string"}},
                    "oneOf": [{"$ref": "#/$defs/a"}, {"type": "string"}]})")
            .find("\"oneOf\" is supported only") != std::string::npos);
}

TEST_CASE("schema size and nesting limits") {
  std::string deep = R"({"type": "integer"})";
  for (int i = 0; i < 40; ++i) {
    deep = R"({"type": "array", "items": )" + deep + "}";
  }
  CHECK(ErrorOf(deep).rfind("json_schema: nesting is deeper than 32", 0) == 0);
  std::string big = R"({"enum": [")" + std::string(70000, 'x') + R"("]})";
  CHECK(ErrorOf(big) == "json_schema: the schema is larger than 64 KiB");
}

TEST_CASE("strict mode refuses extra properties whatever the schema says") {
  const std::string schema =
      R"({"type": "object", "properties": {"a": {"type": "integer"}},
          "additionalProperties": true})";
  CHECK(Matches(Schema(schema, false), R"({"a": 1, "b": 2})"));
  CHECK_FALSE(Matches(Schema(schema, true), R"({"a": 1, "b": 2})"));
  CHECK(Matches(Schema(schema, true), R"({"a": 1})"));
}

}  // namespace
}  // namespace mmserve::grammar
