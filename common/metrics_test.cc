#include "common/metrics.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace mmserve::metrics {
namespace {

// One sample line of the exposition format, parsed back independently of the
// renderer: name{label="value",...} value
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  std::string value;
};

// Parses one sample line; fails the test on malformed input.
Sample ParseSample(const std::string& line) {
  Sample s;
  size_t i = 0;
  while (i < line.size() && line[i] != '{' && line[i] != ' ') s.name += line[i++];
  REQUIRE(i < line.size());
  if (line[i] == '{') {
    ++i;
    while (line[i] != '}') {
      std::string name;
      while (line[i] != '=') name += line[i++];
      REQUIRE(line.substr(i, 2) == "=\"");
      i += 2;
      std::string value;
      while (line[i] != '"') {
        if (line[i] == '\\') {
          ++i;
          REQUIRE((line[i] == '\\' || line[i] == '"' || line[i] == 'n'));
          value += line[i] == 'n' ? '\n' : line[i];
        } else {
          value += line[i];
        }
        ++i;
      }
      ++i;  // closing quote
      s.labels[name] = value;
      if (line[i] == ',') ++i;
    }
    ++i;  // closing brace
  }
  REQUIRE(line[i] == ' ');
  s.value = line.substr(i + 1);
  REQUIRE(!s.value.empty());
  return s;
}

std::vector<Sample> Samples(const std::string& page) {
  std::vector<Sample> out;
  for (absl::string_view line : absl::StrSplit(page, '\n', absl::SkipEmpty())) {
    if (line[0] == '#') continue;
    out.push_back(ParseSample(std::string(line)));
  }
  return out;
}

// Finds the one sample with this name and labels.
std::string ValueOf(const std::string& page, const std::string& name,
                    const std::map<std::string, std::string>& labels = {}) {
  std::string found;
  int matches = 0;
  for (const Sample& s : Samples(page)) {
    if (s.name == name && s.labels == labels) {
      found = s.value;
      ++matches;
    }
  }
  INFO(page);
  REQUIRE(matches == 1);
  return found;
}

// Runs fn in a child process and reports whether it aborted (a failed CHECK).
bool Aborts(const std::function<void()>& fn) {
  pid_t pid = fork();
  if (pid == 0) {
    // Catch2 traps SIGABRT to report it; the child must die of it instead.
    // Keep the expected CHECK message out of the test log.
    std::signal(SIGABRT, SIG_DFL);
    if (freopen("/dev/null", "w", stderr) == nullptr) _exit(2);
    if (freopen("/dev/null", "w", stdout) == nullptr) _exit(2);
    fn();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

TEST_CASE("counter and gauge families render HELP and TYPE once, then each series", "[metrics]") {
  Registry r;
  r.GetCounter("mmserve_requests_total", "Requests by code.", {{"code", "OK"}}).Increment(3);
  r.GetCounter("mmserve_requests_total", "Requests by code.", {{"code", "UNAVAILABLE"}})
      .Increment();
  r.GetGauge("mmserve_queue_length", "Waiting requests.").Set(7);
  r.GetGauge("mmserve_queue_length", "Waiting requests.").Add(-2.5);

  std::string page = r.Render();
  CHECK(page ==
        "# HELP mmserve_queue_length Waiting requests.\n"
        "# TYPE mmserve_queue_length gauge\n"
        "mmserve_queue_length 4.5\n"
        "# HELP mmserve_requests_total Requests by code.\n"
        "# TYPE mmserve_requests_total counter\n"
        "mmserve_requests_total{code=\"OK\"} 3\n"
        "mmserve_requests_total{code=\"UNAVAILABLE\"} 1\n");
}

TEST_CASE("the same name and labels return the same object, in any label order", "[metrics]") {
  Registry r;
  Counter& a = r.GetCounter("c_total", "h", {{"x", "1"}, {"y", "2"}});
  Counter& b = r.GetCounter("c_total", "h", {{"y", "2"}, {"x", "1"}});
  Counter& other = r.GetCounter("c_total", "h", {{"x", "1"}, {"y", "3"}});
  CHECK(&a == &b);
  CHECK(&a != &other);
  a.Increment(2);
  CHECK(b.value() == 2);
  CHECK(other.value() == 0);
  // Labels render sorted by name.
  CHECK(r.Render().find("c_total{x=\"1\",y=\"2\"} 2\n") != std::string::npos);
}

TEST_CASE("label values and help text are escaped and parse back", "[metrics]") {
  Registry r;
  std::string nasty = "a\\b \"quoted\"\nline2";
  r.GetGauge("g", "help with \\ and\nnewline", {{"path", nasty}}).Set(1);
  std::string page = r.Render();
  CHECK(page.find("# HELP g help with \\\\ and\\nnewline\n") != std::string::npos);
  CHECK(page.find("g{path=\"a\\\\b \\\"quoted\\\"\\nline2\"} 1\n") != std::string::npos);
  CHECK(ValueOf(page, "g", {{"path", nasty}}) == "1");
}

TEST_CASE("histogram buckets are cumulative and end with +Inf, _sum and _count", "[metrics]") {
  Registry r;
  Histogram& h = r.GetHistogram("lat_seconds", "Latency.", {0.1, 0.5, 1}, {{"op", "x"}});
  for (double v : {0.05, 0.1, 0.2, 0.7, 3.0, 0.3}) h.Observe(v);
  CHECK(h.count() == 6);
  CHECK(h.sum() == Approx(4.35));

  std::string page = r.Render();
  CHECK(page.find("# TYPE lat_seconds histogram\n") != std::string::npos);
  // 0.1 is inclusive: 0.05 and 0.1 land in le=0.1.
  CHECK(ValueOf(page, "lat_seconds_bucket", {{"op", "x"}, {"le", "0.1"}}) == "2");
  CHECK(ValueOf(page, "lat_seconds_bucket", {{"op", "x"}, {"le", "0.5"}}) == "4");
  CHECK(ValueOf(page, "lat_seconds_bucket", {{"op", "x"}, {"le", "1"}}) == "5");
  CHECK(ValueOf(page, "lat_seconds_bucket", {{"op", "x"}, {"le", "+Inf"}}) == "6");
  CHECK(ValueOf(page, "lat_seconds_count", {{"op", "x"}}) == "6");
  CHECK(std::stod(ValueOf(page, "lat_seconds_sum", {{"op", "x"}})) == Approx(4.35));

  // Cumulativity over every bucket line, in order.
  uint64_t previous = 0;
  int buckets = 0;
  for (const Sample& s : Samples(page)) {
    if (s.name != "lat_seconds_bucket") continue;
    uint64_t v = std::stoull(s.value);
    CHECK(v >= previous);
    previous = v;
    ++buckets;
  }
  CHECK(buckets == 4);
}

TEST_CASE("LatencyBuckets span 1 ms to 60 s, strictly increasing", "[metrics]") {
  std::vector<double> b = LatencyBuckets();
  REQUIRE(b.size() >= 10);
  CHECK(b.front() == 0.001);
  CHECK(b.back() == 60);
  for (size_t i = 1; i < b.size(); ++i) {
    CHECK(b[i] > b[i - 1]);
    CHECK(b[i] / b[i - 1] <= 2.5 + 1e-9);
  }
  Histogram h(b);  // accepted by the histogram's own checks
  CHECK(h.bounds().size() == b.size());
}

TEST_CASE("every sample line of a mixed registry parses back", "[metrics]") {
  Registry r;
  r.GetCounter("a_total", "A.").Increment(0.5);
  r.GetHistogram("b_seconds", "B.", LatencyBuckets()).Observe(0.003);
  r.AddGaugeCallback("c_free", "C.", {{"pool", "kv"}}, [] { return 42.0; });
  std::string page = r.Render();
  std::vector<Sample> samples = Samples(page);
  // 1 counter + (15 buckets + Inf + sum + count) + 1 callback gauge.
  CHECK(samples.size() == 1 + 18 + 1);
  for (const Sample& s : samples) {
    CHECK(IsValidMetricName(s.name));
    char* end = nullptr;
    std::strtod(s.value.c_str(), &end);
    CHECK((*end == '\0' || s.value == "+Inf"));
  }
  CHECK(ValueOf(page, "c_free", {{"pool", "kv"}}) == "42");
  CHECK(ValueOf(page, "b_seconds_bucket", {{"le", "0.0025"}}) == "0");
  CHECK(ValueOf(page, "b_seconds_bucket", {{"le", "0.005"}}) == "1");
  int helps = 0;
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (absl::StartsWith(line, "# HELP")) ++helps;
  }
  CHECK(helps == 3);
}

TEST_CASE("gauge callbacks run at every scrape and can be removed", "[metrics]") {
  Registry r;
  std::atomic<int> free_blocks{10};
  r.AddGaugeCallback("kv_free", "Free blocks.", {}, [&] { return free_blocks.load(); });
  CHECK(ValueOf(r.Render(), "kv_free") == "10");
  free_blocks = 3;
  CHECK(ValueOf(r.Render(), "kv_free") == "3");
  CHECK(r.RemoveGaugeCallback("kv_free", {}));
  CHECK_FALSE(r.RemoveGaugeCallback("kv_free", {}));
  CHECK(r.Render().find("kv_free ") == std::string::npos);
  // The name can be registered again afterwards.
  r.AddGaugeCallback("kv_free", "Free blocks.", {}, [] { return 1.0; });
  CHECK(ValueOf(r.Render(), "kv_free") == "1");
}

TEST_CASE("values format as the shortest round-tripping text", "[metrics]") {
  CHECK(FormatValue(0) == "0");
  CHECK(FormatValue(3) == "3");
  CHECK(FormatValue(0.1) == "0.1");
  CHECK(FormatValue(-2.5) == "-2.5");
  CHECK(FormatValue(1e21) == "1e+21");
  CHECK(FormatValue(1.0 / 3) == "0.3333333333333333");
  CHECK(FormatValue(0.1 + 0.2) == "0.30000000000000004");
  CHECK(std::stod(FormatValue(1.0 / 3)) == 1.0 / 3);
  CHECK(FormatValue(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(FormatValue(-std::numeric_limits<double>::infinity()) == "-Inf");
  CHECK(FormatValue(std::nan("")) == "NaN");
  CHECK(FormatValue(12345678901234.0) == "12345678901234");
}

TEST_CASE("metric names are checked against the Prometheus grammar", "[metrics]") {
  CHECK(IsValidMetricName("mmserve_router_requests_total"));
  CHECK(IsValidMetricName(":recording:rule_1"));
  CHECK(IsValidMetricName("_x"));
  CHECK_FALSE(IsValidMetricName(""));
  CHECK_FALSE(IsValidMetricName("1abc"));
  CHECK_FALSE(IsValidMetricName("a-b"));
  CHECK_FALSE(IsValidMetricName("a b"));
  CHECK_FALSE(IsValidMetricName("caf\xc3\xa9"));
}

TEST_CASE("misuse CHECK-fails: kind, help, buckets, names, labels", "[metrics]") {
  auto with_counter = [](auto fn) {
    return [fn] {
      Registry r;
      r.GetCounter("x_total", "X.");
      fn(r);
    };
  };
  CHECK(Aborts(with_counter([](Registry& r) { r.GetGauge("x_total", "X."); })));
  CHECK(Aborts(with_counter([](Registry& r) { r.GetCounter("x_total", "other help"); })));
  CHECK(Aborts(with_counter([](Registry& r) { r.GetCounter("bad-name", "X."); })));
  CHECK(Aborts(with_counter([](Registry& r) { r.GetCounter("y", "Y.", {{"0bad", "v"}}); })));
  CHECK(Aborts(with_counter([](Registry& r) {
    r.GetCounter("y", "Y.", {{"a", "1"}, {"a", "2"}});
  })));
  CHECK(Aborts(with_counter([](Registry& r) { r.GetCounter("x_total", "X.").Increment(-1); })));
  CHECK(Aborts([] {
    Registry r;
    r.GetHistogram("h", "H.", {1, 2});
    r.GetHistogram("h", "H.", {1, 3});
  }));
  CHECK(Aborts([] {
    Registry r;
    r.GetHistogram("h", "H.", {1, 2}, {{"le", "x"}});
  }));
  CHECK(Aborts([] { Histogram h({1, 1}); }));
  CHECK(Aborts([] {
    Registry r;
    r.GetGauge("g", "G.");
    r.AddGaugeCallback("g", "G.", {}, [] { return 0.0; });
  }));
  // And the same calls used correctly do not abort.
  CHECK_FALSE(Aborts([] {
    Registry r;
    r.GetCounter("x_total", "X.", {{"a", "1"}}).Increment(0);
    r.GetHistogram("h", "H.", {1, 2});
    r.GetHistogram("h", "H.", {1, 2}, {{"k", "v"}});
  }));
}

TEST_CASE("gauge callbacks added and removed while other threads scrape", "[metrics]") {
  Registry r;
  std::atomic<bool> stop{false};
  std::atomic<int> scrapes{0}, wrong{0};  // Catch2 asserts only on this thread
  std::vector<std::thread> scrapers;
  for (int t = 0; t < 2; ++t) {
    scrapers.emplace_back([&] {
      while (!stop.load()) {
        const std::string page = r.Render();
        // A rendered callback gauge always shows its own value.
        for (size_t at = page.find("cb{i=\""); at != std::string::npos;
             at = page.find("cb{i=\"", at + 1)) {
          const size_t end = page.find('"', at + 6);
          const std::string i = page.substr(at + 6, end - at - 6);
          const size_t line_end = page.find('\n', at);
          if (page.substr(end + 3, line_end - end - 3) != i) ++wrong;
        }
        ++scrapes;
      }
    });
  }
  for (int i = 0; i < 2000; ++i) {
    const Labels labels = {{"i", std::to_string(i % 16)}};
    r.RemoveGaugeCallback("cb", labels);
    r.AddGaugeCallback("cb", "Callback.", labels, [i] { return (i % 16) * 1.0; });
    r.GetCounter("n_total", "N.", {{"i", std::to_string(i % 64)}}).Increment();
  }
  stop = true;
  for (std::thread& t : scrapers) t.join();
  CHECK(scrapes.load() > 0);
  CHECK(wrong.load() == 0);
  for (int i = 0; i < 16; ++i) CHECK(r.RemoveGaugeCallback("cb", {{"i", std::to_string(i)}}));
}

TEST_CASE("concurrent updates from several threads give exact totals", "[metrics]") {
  Registry r;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 100000;
  Counter& counter = r.GetCounter("ops_total", "Ops.");
  Gauge& gauge = r.GetGauge("level", "Level.");
  Histogram& hist = r.GetHistogram("v", "V.", {0.5, 1.5});
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread also looks the metrics up, racing the registry's map.
      Counter& mine = r.GetCounter("ops_total", "Ops.", {{"thread", std::to_string(t)}});
      for (int i = 0; i < kPerThread; ++i) {
        counter.Increment();
        mine.Increment(2);
        gauge.Add(i % 2 == 0 ? 1 : -1);
        hist.Observe(i % 2);  // 0 -> le=0.5, 1 -> le=1.5
      }
    });
  }
  // Scrapes race with the updates.
  std::string page;
  for (int i = 0; i < 20; ++i) page = r.Render();
  for (std::thread& t : threads) t.join();

  CHECK(counter.value() == kThreads * kPerThread);
  CHECK(gauge.value() == 0);
  CHECK(hist.count() == uint64_t{kThreads} * kPerThread);
  CHECK(hist.sum() == kThreads * kPerThread / 2);
  page = r.Render();
  for (int t = 0; t < kThreads; ++t) {
    CHECK(ValueOf(page, "ops_total", {{"thread", std::to_string(t)}}) ==
          std::to_string(2 * kPerThread));
  }
  CHECK(ValueOf(page, "v_bucket", {{"le", "0.5"}}) == std::to_string(kThreads * kPerThread / 2));
  CHECK(ValueOf(page, "v_bucket", {{"le", "+Inf"}}) == std::to_string(kThreads * kPerThread));
}

}  // namespace
}  // namespace mmserve::metrics
