// The elastic manager's step-time models: the default and the file format.
#include "router/elastic_step_models.h"

#include <catch2/catch.hpp>

namespace mmserve::router {
namespace {

TEST_CASE("the default models give no degree a speedup") {
  const auto models = DefaultElasticStepModels(4);
  REQUIRE(models.size() == 4);
  for (int64_t s : {16, 512, 4096}) {
    for (size_t d = 1; d < models.size(); ++d) {
      CHECK(models[d].Predict(s) > models[d - 1].Predict(s));
    }
  }
  CHECK(DefaultElasticStepModels(0).size() == 1);
}

TEST_CASE("a models file gives degrees 1..n, comments and blank lines skipped") {
  auto models = ParseElasticStepModels("# fitted\n1 0.001 1e-5 0\n\n2 0.002 6e-6 1e-9  # two\n");
  REQUIRE(models.ok());
  REQUIRE(models->size() == 2);
  CHECK((*models)[1].a == 0.002);
  CHECK((*models)[1].c == 1e-9);
  CHECK(absl::IsInvalidArgument(ParseElasticStepModels("2 0 0 0\n").status()));
  CHECK(absl::IsInvalidArgument(ParseElasticStepModels("1 0 0\n").status()));
  CHECK(absl::IsInvalidArgument(ParseElasticStepModels("1 0 0 0\n1 0 0 0\n").status()));
  CHECK(absl::IsInvalidArgument(ParseElasticStepModels("").status()));
}

TEST_CASE("a formatted models file reads back exactly, comments skipped") {
  const std::vector<scheduler::StepTimeModel> models = {{0.1 / 3, 1.0 / 7e5, 2.0 / 3e9},
                                                        {1e-3, 0, 4.25e-9}};
  const std::string text =
      FormatElasticStepModels(models, {"fitted 2026-11-26", "loadavg 1.5\n2 profiled layers"});
  CHECK(text.rfind("# fitted 2026-11-26\n# loadavg 1.5\n# 2 profiled layers\n", 0) == 0);
  auto back = ParseElasticStepModels(text);
  REQUIRE(back.ok());
  REQUIRE(back->size() == 2);
  for (size_t d = 0; d < 2; ++d) {
    CHECK((*back)[d].a == models[d].a);
    CHECK((*back)[d].b == models[d].b);
    CHECK((*back)[d].c == models[d].c);
  }
  CHECK(absl::IsInvalidArgument(
      ParseElasticStepModels(FormatElasticStepModels({}, {"none"})).status()));
}

}  // namespace
}  // namespace mmserve::router
