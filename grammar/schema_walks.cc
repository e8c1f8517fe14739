// Prints, for every case of the schema corpus, documents made by random
// walks over a small random vocabulary (one JSON line each: {"name",
// "doc"}), for schema_validation_test.py to check with python3-jsonschema.
//   schema_walks <corpus.json> <walks per case>
#include <cstdlib>
#include <iostream>
#include <random>

#include "grammar/grammar.h"
#include "grammar/grammar_testing.h"
#include "grammar/schema_corpus.h"

int main(int argc, char** argv) {
  using namespace mmserve::grammar;
  if (argc != 3) {
    std::cerr << "usage: schema_walks <corpus.json> <walks per case>\n";
    return 2;
  }
  const int walks = std::atoi(argv[2]);
  auto vocab = testing::RandomVocabulary(5, 400);
  std::mt19937 rng(17);
  for (const testing::SchemaCase& c : testing::LoadSchemaCorpus(argv[1])) {
    ConstraintSpec spec{ConstraintSpec::Kind::kJsonSchema, c.schema, c.strict};
    auto g = testing::MustCompile(spec, vocab);
    for (int i = 0; i < walks; ++i) {
      const std::optional<std::string> doc = testing::RandomWalk(Matcher(g), *vocab, rng, 400, 0.5);
      if (!doc) continue;  // too long: not a finished document
      nlohmann::json line = {{"name", c.name}, {"doc", *doc}};
      std::cout << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
  }
  return 0;
}
