// The JSON schema test corpus (testdata/schema_corpus.json): per case a
// schema, documents it must accept, documents it must reject as invalid,
// and valid documents it rejects by design (not in the compact form, or
// properties out of order).
#ifndef MMSERVE_GRAMMAR_SCHEMA_CORPUS_H_
#define MMSERVE_GRAMMAR_SCHEMA_CORPUS_H_

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace mmserve::grammar::testing {

struct SchemaCase {
  std::string name;
  std::string schema;
  bool strict = false;
  std::vector<std::string> valid, invalid, refused_valid;
};

inline std::vector<SchemaCase> LoadSchemaCorpus(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::vector<SchemaCase> cases;
  for (const auto& c : nlohmann::ordered_json::parse(text.str())) {
    SchemaCase sc;
    sc.name = c["name"];
    sc.schema = c["schema"].dump();
    sc.strict = c["strict"];
    for (const auto& d : c["valid"]) sc.valid.push_back(d);
    for (const auto& d : c["invalid"]) sc.invalid.push_back(d);
    for (const auto& d : c["refused_valid"]) sc.refused_valid.push_back(d);
    cases.push_back(sc);
  }
  return cases;
}

inline constexpr char kCorpusPath[] = "grammar/testdata/schema_corpus.json";

}  // namespace mmserve::grammar::testing

#endif  // MMSERVE_GRAMMAR_SCHEMA_CORPUS_H_
