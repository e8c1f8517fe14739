// The elastic manager's step-time models refitted from measured prefills.
#include "router/elastic_step_fit.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "router/elastic_step_models.h"

namespace mmserve::router {
namespace {

using scheduler::StepTimeModel;

// The time T(S) gives, as a pool would measure it.
void AddExact(ElasticStepFit& fit, int degree, const StepTimeModel& t, int64_t tokens) {
  fit.Add(degree, tokens, t.Predict(tokens));
}

TEST_CASE("the given models stand until degree 1 has enough distinct lengths") {
  const auto given = DefaultElasticStepModels(2);
  ElasticStepFit fit(given);
  const StepTimeModel slow{.a = 0.05, .b = 2e-4, .c = 1e-8};
  for (int k = 0; k < 10; ++k) AddExact(fit, 1, slow, 500);  // one length only
  AddExact(fit, 1, slow, 700);                               // two
  AddExact(fit, 1, slow, 900);  // three, but the longest is under twice the shortest
  CHECK_FALSE(fit.fitted(1));
  CHECK(fit.models()[0].Predict(1000) == given[0].Predict(1000));
  AddExact(fit, 1, slow, 1200);
  REQUIRE(fit.fitted(1));
  for (int64_t s : {100, 1000, 4000}) {
    CHECK(fit.models()[0].Predict(s) == Approx(slow.Predict(s)).epsilon(1e-6));
  }
}

TEST_CASE("an unfitted degree keeps the given ratio to degree 1 on top of degree 1's fit") {
  const std::vector<StepTimeModel> given = {{.a = 1e-3, .b = 1e-5, .c = 4e-9},
                                            {.a = 2e-3, .b = 1e-5, .c = 1e-9}};
  ElasticStepFit fit(given);
  const StepTimeModel measured{.a = 0.01, .b = 3e-5, .c = 8e-9};
  for (int64_t s : {256, 512, 1024, 2048}) AddExact(fit, 1, measured, s);
  REQUIRE(fit.fitted(1));
  CHECK_FALSE(fit.fitted(2));
  const StepTimeModel& two = fit.models()[1];
  CHECK(two.a == Approx(2 * fit.models()[0].a));
  CHECK(two.b == Approx(fit.models()[0].b));
  CHECK(two.c == Approx(fit.models()[0].c / 4));
  // Degree 2's measured samples, once enough, replace the ratio.
  const StepTimeModel grouped{.a = 0.02, .b = 2e-5, .c = 1e-9};
  for (int64_t s : {1024, 2048, 4096}) AddExact(fit, 2, grouped, s);
  REQUIRE(fit.fitted(2));
  for (int64_t s : {1024, 3000}) {
    CHECK(fit.models()[1].Predict(s) == Approx(grouped.Predict(s)).epsilon(1e-6));
  }
}

TEST_CASE("a degree measured before degree 1 waits for it") {
  ElasticStepFit fit(DefaultElasticStepModels(2));
  const StepTimeModel grouped{.a = 0.02, .b = 2e-5, .c = 1e-9};
  for (int64_t s : {1024, 2048, 4096}) AddExact(fit, 2, grouped, s);
  CHECK_FALSE(fit.fitted(2));
  CHECK(fit.models()[1].Predict(2048) == DefaultElasticStepModels(2)[1].Predict(2048));
}

TEST_CASE("only the newest samples count, and bad ones are ignored") {
  ElasticStepFit fit(DefaultElasticStepModels(1), /*window=*/4);
  const StepTimeModel before{.a = 1.0, .b = 1e-3, .c = 0};
  const StepTimeModel after{.a = 0.01, .b = 1e-5, .c = 0};
  for (int64_t s : {100, 200, 400, 800}) AddExact(fit, 1, before, s);
  REQUIRE(fit.models()[0].Predict(300) == Approx(before.Predict(300)).epsilon(1e-6));
  for (int64_t s : {100, 200, 400, 800}) AddExact(fit, 1, after, s);
  CHECK(fit.models()[0].Predict(300) == Approx(after.Predict(300)).epsilon(1e-6));
  fit.Add(0, 100, 1.0);
  fit.Add(2, 100, 1.0);
  fit.Add(1, 0, 1.0);
  fit.Add(1, 100, -1.0);
  fit.Add(1, 100, std::numeric_limits<double>::quiet_NaN());
  fit.Add(1, 100, std::numeric_limits<double>::infinity());
  CHECK(fit.models()[0].Predict(300) == Approx(after.Predict(300)).epsilon(1e-6));
  CHECK_FALSE(fit.fitted(2));
  CHECK_FALSE(fit.fitted(0));
}

}  // namespace
}  // namespace mmserve::router
