// A small Prometheus registry: counters, gauges, histograms and scrape-time
// gauge callbacks, rendered in the text exposition format 0.0.4.
//
//   metrics::Registry registry;
//   metrics::Counter& requests = registry.GetCounter(
//       "mmserve_router_requests_total", "Requests by final gRPC code.", {{"code", "OK"}});
//   metrics::Histogram& ttft = registry.GetHistogram(
//       "mmserve_router_ttft_seconds", "Time to first token.", metrics::LatencyBuckets());
//   requests.Increment();
//   ttft.Observe(0.042);
//   registry.AddGaugeCallback("mmserve_language_kv_blocks_free", "Free KV blocks.", {},
//                             [&pool] { return pool.num_free_blocks(); });
//   std::string page = registry.Render();  // what GET /metrics returns
//
// Thread-safety: everything is thread-safe. Counter, Gauge and Histogram
// updates are lock-free (relaxed atomics) and never touch the registry; the
// Get* calls and Render take the registry's mutex, so look a metric up once
// and keep the reference on hot paths. Render reads each value atomically,
// but not all values at one instant (a histogram's _sum may lag its buckets
// by an in-flight Observe), as with every Prometheus client.
#ifndef MMSERVE_COMMON_METRICS_H_
#define MMSERVE_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace mmserve::metrics {

// Label name/value pairs. Order does not matter: {{a,1},{b,2}} and
// {{b,2},{a,1}} name the same series.
using Labels = std::vector<std::pair<std::string, std::string>>;

// A monotonically increasing value (Prometheus counter).
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds v, which must be >= 0 (CHECK-fails otherwise: counters only grow).
  void Increment(double v = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Counts observations into fixed buckets (upper bounds, inclusive).
class Histogram {
 public:
  // `bounds` must be finite and strictly increasing (CHECK-fails otherwise);
  // the +Inf bucket is implicit.
  explicit Histogram(std::vector<double> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void Observe(double v);
  uint64_t count() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }

  const std::vector<double>& bounds() const { return bounds_; }
  // Observations per bucket, not cumulative; the last entry is the +Inf
  // bucket (size bounds().size() + 1).
  std::vector<uint64_t> BucketCounts() const;

 private:
  const std::vector<double> bounds_;
  const std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0};
};

// Default latency buckets in seconds: 0.001 .. 60 in 1-2.5-5 steps.
std::vector<double> LatencyBuckets();

// Whether `name` is a valid metric name: [a-zA-Z_:][a-zA-Z0-9_:]*.
[[nodiscard]] bool IsValidMetricName(const std::string& name);

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Same (name, labels) returns the same object; references stay valid for
  // the registry's life. Same name with a different kind, help or buckets
  // CHECK-fails, as do invalid metric or label names, duplicate label names
  // and the label name "le" on a histogram.
  Counter& GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& GetHistogram(const std::string& name, const std::string& help,
                          const std::vector<double>& buckets, const Labels& labels = {});

  // A gauge computed at scrape time (e.g. free blocks read from an
  // allocator). `fn` runs on the scraping thread, outside the registry's
  // mutex, and must be thread-safe; whatever it reads must outlive the
  // registry or RemoveGaugeCallback. A second callback or a Gauge with the
  // same (name, labels) CHECK-fails.
  void AddGaugeCallback(const std::string& name, const std::string& help, const Labels& labels,
                        std::function<double()> fn);
  // Removes the callback registered for (name, labels); returns whether there
  // was one. After it returns, a Render that started later no longer calls it
  // (one already running may still be calling it).
  bool RemoveGaugeCallback(const std::string& name, const Labels& labels);

  // Prometheus text exposition format 0.0.4: # HELP / # TYPE once per family
  // (families sorted by name, series by labels), label values escaped,
  // histograms with cumulative _bucket{le=...} incl. +Inf, _sum, _count.
  std::string Render() const;

 private:
  struct Family;
  Family& GetFamily(const std::string& name, const std::string& help, int kind,
                    const std::vector<double>* buckets) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Family>> families_ ABSL_GUARDED_BY(mu_);
};

// Escapes a label value for the text format: backslash, double quote and
// line feed become \\, \" and \n.
std::string EscapeLabelValue(const std::string& value);

// Formats a sample value the way Prometheus clients do: shortest text that
// reads back to the same double, "+Inf", "-Inf", "NaN".
std::string FormatValue(double v);

}  // namespace mmserve::metrics

#endif  // MMSERVE_COMMON_METRICS_H_
