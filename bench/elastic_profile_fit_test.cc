// bench:elastic_profile's fit: known per-degree quadratics are recovered, and
// the models file it writes reads back through the router's parser.
#include "bench/elastic_profile_fit.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "router/elastic_step_models.h"

namespace mmserve::bench {
namespace {

TEST_CASE("the profile fit recovers each degree's quadratic and the router reads its file") {
  // Degree 2 halves the per-token work and adds an exchange's fixed cost.
  const std::vector<scheduler::StepTimeModel> truth = {{2e-3, 4.5e-4, 6e-9},
                                                       {5e-3, 2.4e-4, 3.1e-9}};
  std::vector<ElasticProfilePoint> points;
  for (int d = 1; d <= 2; ++d) {
    for (int64_t s : {4096, 256, 1024, 512, 2048})
      points.push_back({d, s, truth[d - 1].Predict(s)});
  }
  auto fit = FitElasticProfile(points);
  REQUIRE(fit.ok());
  REQUIRE(fit->models.size() == 2);
  for (int d = 0; d < 2; ++d) {
    INFO("degree " << d + 1);
    CHECK(fit->models[d].a == Approx(truth[d].a).epsilon(1e-9));
    CHECK(fit->models[d].b == Approx(truth[d].b).epsilon(1e-9));
    CHECK(fit->models[d].c == Approx(truth[d].c).epsilon(1e-9));
    CHECK(fit->max_abs_error[d] < 1e-9);
  }
  REQUIRE(fit->rows.size() == 10);
  CHECK(fit->rows.front().degree == 1);
  CHECK(fit->rows.front().tokens == 256);
  CHECK(fit->rows.back().tokens == 4096);
  CHECK(ElasticProfileTable(*fit).find("T_2(S) = ") != std::string::npos);

  const std::string file = router::FormatElasticStepModels(
      fit->models, {"bench:elastic_profile, 2026-11-26", "loadavg 1.0"});
  auto back = router::ParseElasticStepModels(file);
  REQUIRE(back.ok());
  REQUIRE(back->size() == 2);
  for (int d = 0; d < 2; ++d) {
    CHECK((*back)[d].a == fit->models[d].a);
    CHECK((*back)[d].b == fit->models[d].b);
    CHECK((*back)[d].c == fit->models[d].c);
  }
}

TEST_CASE("the profile fit refuses gaps in the degrees and empty measurements") {
  CHECK(absl::IsInvalidArgument(FitElasticProfile({}).status()));
  CHECK(absl::IsInvalidArgument(FitElasticProfile({{2, 512, 0.1}}).status()));
  CHECK(absl::IsInvalidArgument(FitElasticProfile({{1, 512, 0.1}, {3, 512, 0.1}}).status()));
  CHECK(absl::IsInvalidArgument(FitElasticProfile({{1, 0, 0.1}}).status()));
  CHECK(absl::IsInvalidArgument(FitElasticProfile({{1, 512, 0}}).status()));
}

TEST_CASE("noisy profiles still give models with no negative coefficient") {
  // Flat then steep: a plain quadratic fit would take a < 0.
  auto fit = FitElasticProfile({{1, 256, 0.05}, {1, 512, 0.06}, {1, 1024, 0.2}, {1, 2048, 0.9}});
  REQUIRE(fit.ok());
  CHECK(fit->models[0].a >= 0);
  CHECK(fit->models[0].b >= 0);
  CHECK(fit->models[0].c >= 0);
}

}  // namespace
}  // namespace mmserve::bench
