#include "router/elastic_step_models.h"

#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace mmserve::router {

std::vector<scheduler::StepTimeModel> DefaultElasticStepModels(int max_degree) {
  const scheduler::StepTimeModel one{.a = 2e-3, .b = 1e-5, .c = 2e-9};
  std::vector<scheduler::StepTimeModel> models;
  for (int d = 1; d <= std::max(1, max_degree); ++d) {
    const double extra = d - 1;
    models.push_back({.a = one.a + extra * 1e-3, .b = one.b + extra * 1e-6, .c = one.c});
  }
  return models;
}

absl::StatusOr<std::vector<scheduler::StepTimeModel>> ParseElasticStepModels(
    absl::string_view text) {
  std::map<int, scheduler::StepTimeModel> by_degree;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int degree = 0;
    scheduler::StepTimeModel m;
    if (f.size() != 4 || !absl::SimpleAtoi(f[0], &degree) || !absl::SimpleAtod(f[1], &m.a) ||
        !absl::SimpleAtod(f[2], &m.b) || !absl::SimpleAtod(f[3], &m.c) || degree < 1 ||
        !by_degree.emplace(degree, m).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step models, line ", line_no, ": expected a new \"degree a b c\", got \"", line, "\""));
    }
  }
  std::vector<scheduler::StepTimeModel> models;
  for (const auto& [degree, m] : by_degree) {
    if (degree != static_cast<int>(models.size()) + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("step models: degree ", models.size() + 1, " is missing"));
    }
    models.push_back(m);
  }
  if (models.empty()) return absl::InvalidArgumentError("step models: none given");
  return models;
}

std::string FormatElasticStepModels(const std::vector<scheduler::StepTimeModel>& models,
                                    const std::vector<std::string>& comments) {
  std::string out;
  for (const std::string& c : comments) {
    for (absl::string_view line : absl::StrSplit(c, '\n')) absl::StrAppend(&out, "# ", line, "\n");
  }
  for (size_t d = 0; d < models.size(); ++d) {
    absl::StrAppendFormat(&out, "%d %.17g %.17g %.17g\n", d + 1, models[d].a, models[d].b,
                          models[d].c);
  }
  return out;
}

}  // namespace mmserve::router
