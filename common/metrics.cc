#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mmserve::metrics {
namespace {

enum Kind : int { kCounter = 0, kGauge = 1, kHistogram = 2 };

const char* KindName(int kind) {
  switch (kind) {
    case kCounter:
      return "counter";
    case kGauge:
      return "gauge";
    default:
      return "histogram";
  }
}

// Adds to an atomic double; std::atomic<double>::fetch_add is C++20.
void AtomicAdd(std::atomic<double>& a, double v) {
  double old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

bool IsValidLabelName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  // Names starting with "__" are reserved for Prometheus itself.
  return name.rfind("__", 0) != 0;
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// Checks the labels and renders them sorted by name as `a="x",b="y"` (no
// braces). The rendering is also the series' key within its family.
std::string LabelKey(const std::string& metric, const Labels& labels, int kind) {
  Labels sorted = labels;
  std::sort(sorted.begin(), sorted.end());
  std::string key;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const auto& [name, value] = sorted[i];
    CHECK(IsValidLabelName(name)) << "metric " << metric << ": invalid label name '" << name << "'";
    CHECK(i == 0 || sorted[i - 1].first != name)
        << "metric " << metric << ": duplicate label '" << name << "'";
    CHECK(kind != kHistogram || name != "le")
        << "metric " << metric << ": 'le' is reserved on histograms";
    if (i > 0) key += ',';
    absl::StrAppend(&key, name, "=\"", EscapeLabelValue(value), "\"");
  }
  return key;
}

// `{key}` or `{key,extra}`, or nothing when both are empty.
std::string Braced(const std::string& key, const std::string& extra = "") {
  if (key.empty() && extra.empty()) return "";
  if (key.empty()) return absl::StrCat("{", extra, "}");
  if (extra.empty()) return absl::StrCat("{", key, "}");
  return absl::StrCat("{", key, ",", extra, "}");
}

}  // namespace

void Counter::Increment(double v) {
  CHECK(v >= 0) << "counters only grow: Increment(" << v << ")";
  AtomicAdd(value_, v);
}

void Gauge::Add(double v) { AtomicAdd(value_, v); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    CHECK(std::isfinite(bounds_[i])) << "histogram bucket bounds must be finite";
    CHECK(i == 0 || bounds_[i - 1] < bounds_[i]) << "histogram buckets must strictly increase";
  }
}

void Histogram::Observe(double v) {
  // First bound >= v: buckets are "less than or equal"; NaN lands in +Inf.
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, v);
}

uint64_t Histogram::count() const {
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) total += counts_[i].load(std::memory_order_relaxed);
  return total;
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = counts_[i].load(std::memory_order_relaxed);
  return out;
}

std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60};
}

bool IsValidMetricName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  for (int precision = 15; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// One series: exactly one of the pointers is set.
struct Series {
  std::unique_ptr<Counter> counter;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<Histogram> histogram;
  std::shared_ptr<const std::function<double()>> callback;
};

struct Registry::Family {
  int kind;
  std::string help;
  std::vector<double> buckets;           // histograms only
  std::map<std::string, Series> series;  // by LabelKey
};

Registry::Registry() = default;
Registry::~Registry() = default;

Registry::Family& Registry::GetFamily(const std::string& name, const std::string& help, int kind,
                                      const std::vector<double>* buckets) {
  CHECK(IsValidMetricName(name)) << "invalid metric name '" << name << "'";
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second = std::make_unique<Family>();
    it->second->kind = kind;
    it->second->help = help;
    if (buckets != nullptr) it->second->buckets = *buckets;
  }
  Family& family = *it->second;
  CHECK(family.kind == kind) << "metric " << name << " registered as " << KindName(family.kind)
                             << ", requested as " << KindName(kind);
  CHECK(family.help == help) << "metric " << name << " registered with help '" << family.help
                             << "', requested with '" << help << "'";
  CHECK(buckets == nullptr || family.buckets == *buckets)
      << "metric " << name << " registered with other buckets";
  return family;
}

Counter& Registry::GetCounter(const std::string& name, const std::string& help,
                              const Labels& labels) {
  absl::MutexLock lock(&mu_);
  Family& family = GetFamily(name, help, kCounter, nullptr);
  Series& series = family.series[LabelKey(name, labels, kCounter)];
  if (series.counter == nullptr) series.counter = std::make_unique<Counter>();
  return *series.counter;
}

Gauge& Registry::GetGauge(const std::string& name, const std::string& help, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  Family& family = GetFamily(name, help, kGauge, nullptr);
  Series& series = family.series[LabelKey(name, labels, kGauge)];
  CHECK(series.callback == nullptr)
      << "metric " << name << ": a gauge callback already has these labels";
  if (series.gauge == nullptr) series.gauge = std::make_unique<Gauge>();
  return *series.gauge;
}

Histogram& Registry::GetHistogram(const std::string& name, const std::string& help,
                                  const std::vector<double>& buckets, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  Family& family = GetFamily(name, help, kHistogram, &buckets);
  Series& series = family.series[LabelKey(name, labels, kHistogram)];
  if (series.histogram == nullptr) series.histogram = std::make_unique<Histogram>(buckets);
  return *series.histogram;
}

void Registry::AddGaugeCallback(const std::string& name, const std::string& help,
                                const Labels& labels, std::function<double()> fn) {
  CHECK(fn != nullptr) << "metric " << name << ": empty callback";
  absl::MutexLock lock(&mu_);
  Family& family = GetFamily(name, help, kGauge, nullptr);
  Series& series = family.series[LabelKey(name, labels, kGauge)];
  CHECK(series.gauge == nullptr && series.callback == nullptr)
      << "metric " << name << ": these labels are already registered";
  series.callback = std::make_shared<const std::function<double()>>(std::move(fn));
}

bool Registry::RemoveGaugeCallback(const std::string& name, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second->kind != kGauge) return false;
  auto series = it->second->series.find(LabelKey(name, labels, kGauge));
  if (series == it->second->series.end() || series->second.callback == nullptr) return false;
  it->second->series.erase(series);
  return true;
}

std::string Registry::Render() const {
  // Snapshot under the lock (metric objects are never freed while the
  // registry lives), then read values and run callbacks without it.
  struct Row {
    std::string key;
    const Counter* counter = nullptr;
    const Gauge* gauge = nullptr;
    const Histogram* histogram = nullptr;
    std::shared_ptr<const std::function<double()>> callback;
  };
  struct Snapshot {
    std::string name;
    std::string help;
    int kind;
    std::vector<Row> rows;
  };
  std::vector<Snapshot> snapshot;
  {
    absl::MutexLock lock(&mu_);
    snapshot.reserve(families_.size());
    for (const auto& [name, family] : families_) {
      Snapshot& s = snapshot.emplace_back();
      s.name = name;
      s.help = family->help;
      s.kind = family->kind;
      for (const auto& [key, series] : family->series) {
        s.rows.push_back(Row{key, series.counter.get(), series.gauge.get(), series.histogram.get(),
                             series.callback});
      }
    }
  }

  std::string out;
  for (const Snapshot& s : snapshot) {
    if (s.rows.empty()) continue;  // e.g. its only callback was removed
    absl::StrAppend(&out, "# HELP ", s.name, " ", EscapeHelp(s.help), "\n");
    absl::StrAppend(&out, "# TYPE ", s.name, " ", KindName(s.kind), "\n");
    for (const Row& row : s.rows) {
      if (row.histogram == nullptr) {
        double v = row.counter ? row.counter->value()
                   : row.gauge ? row.gauge->value()
                               : (*row.callback)();
        absl::StrAppend(&out, s.name, Braced(row.key), " ", FormatValue(v), "\n");
        continue;
      }
      const Histogram& h = *row.histogram;
      std::vector<uint64_t> counts = h.BucketCounts();
      double sum = h.sum();
      uint64_t cumulative = 0;
      for (size_t i = 0; i < counts.size(); ++i) {
        cumulative += counts[i];
        std::string le = i < h.bounds().size() ? FormatValue(h.bounds()[i]) : "+Inf";
        absl::StrAppend(&out, s.name, "_bucket", Braced(row.key, absl::StrCat("le=\"", le, "\"")),
                        " ", cumulative, "\n");
      }
      absl::StrAppend(&out, s.name, "_sum", Braced(row.key), " ", FormatValue(sum), "\n");
      absl::StrAppend(&out, s.name, "_count", Braced(row.key), " ", cumulative, "\n");
    }
  }
  return out;
}

}  // namespace mmserve::metrics
