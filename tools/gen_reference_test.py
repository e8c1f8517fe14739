#!/usr/bin/python3
"""tools/gen_reference.py: reading metric registrations out of C++, reading
abseil's --helpfull, and the staleness check that fails when a metric or a
flag is added without regenerating the pages."""
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_reference as g  # noqa: E402

SOURCE = r'''
void Register(metrics::Registry& metrics, const std::string& kind) {
  const char* help =
      "Bytes moved, by kind "
      "and direction.";
  sent_ = &metrics.GetCounter("mmserve_language_moved_total", help,
                              {{"kind", kind}, {"dir", "sent"}});
  received_ = &metrics.GetCounter("mmserve_language_moved_total", help,
                                  {{"kind", kind}, {"dir", "received"}});
  // metrics.GetCounter("mmserve_language_commented_out_total", "Not registered.");
  step_ = &metrics.GetHistogram("mmserve_language_step_seconds", "One step (a, b).",
                                metrics::LatencyBuckets());
  batch_ = &metrics.GetHistogram("mmserve_language_batch", "Per batch.", {1, 2, 4});
  registry.AddGaugeCallback("mmserve_language_free", "Free blocks.", {}, [&] { return 1.0; });
}
'''


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


class MetricSourceTest(unittest.TestCase):
    def test_reads_every_registration_kind_and_skips_comments(self):
        calls = g.metric_calls(os.path.join(g.ROOT, "language_service/x.cc"), SOURCE)
        names = [c[0] for c in calls]
        self.assertEqual(names, ["mmserve_language_moved_total", "mmserve_language_moved_total",
                                 "mmserve_language_step_seconds", "mmserve_language_batch",
                                 "mmserve_language_free"])
        moved = calls[0]
        self.assertEqual(moved[1], "counter")
        self.assertEqual(moved[2], "Bytes moved, by kind and direction.")
        self.assertEqual(moved[3], {"kind": {"set by `kind`"}, "dir": {"`sent`"}})
        self.assertEqual(calls[2][1:3], ("histogram", "One step (a, b)."))
        self.assertEqual(calls[2][4], "latency: 0.001 to 60 s")
        self.assertEqual(calls[3][4], "1, 2, 4")
        self.assertEqual(calls[4][1], "gauge")

    def test_a_name_that_is_not_a_literal_is_refused(self):
        src = 'void F(Registry& m, std::string n) { m.GetCounter(n, "Help."); }'
        with self.assertRaisesRegex(g.ReferenceError, r"x\.cc:1: the metric name 'n' is not a "
                                    r"string literal"):
            g.metric_calls(os.path.join(g.ROOT, "router/x.cc"), src)

    def test_a_help_the_file_does_not_define_is_refused(self):
        src = 'void F(Registry& m) { m.GetGauge("mmserve_router_x", HelpFromElsewhere()); }'
        with self.assertRaisesRegex(g.ReferenceError, "the help of mmserve_router_x"):
            g.metric_calls(os.path.join(g.ROOT, "router/x.cc"), src)

    def test_one_name_with_two_helps_is_refused(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, "router/a.cc", 'm.GetCounter("mmserve_router_a_total", "One.");')
            write(root, "router/b.cc", 'm.GetCounter("mmserve_router_a_total", "Two.");')
            old = g.ROOT
            g.ROOT = root
            try:
                with self.assertRaisesRegex(g.ReferenceError, "another type, help or buckets"):
                    g.collect_metrics(["router"])
            finally:
                g.ROOT = old


class StalenessTest(unittest.TestCase):
    def test_a_metric_added_without_regenerating_makes_the_page_stale(self):
        with tempfile.TemporaryDirectory() as root:
            old = g.ROOT
            g.ROOT = root
            try:
                write(root, "router/calls.cc",
                      'm.GetCounter("mmserve_router_requests_total", "Calls.", {{"code", c}});\n')
                write(root, "router/calls_test.cc",
                      'm.GetCounter("mmserve_router_test_only_total", "Ignored.");\n')
                page = g.metrics_page(g.collect_metrics(["router"]))
                self.assertIn("| `mmserve_router_requests_total` | counter | `code`: set by `c` |",
                              page)
                self.assertNotIn("mmserve_router_test_only_total", page)  # tests do not count
                write(root, g.METRICS_PAGE, page)
                self.assertEqual(g.stale_pages({g.METRICS_PAGE: page}), [])

                write(root, "router/calls.cc",
                      g.read(os.path.join(root, "router/calls.cc"))
                      + 'm.GetGauge("mmserve_router_new_gauge", "Added later.");\n')
                regenerated = g.metrics_page(g.collect_metrics(["router"]))
                stale = g.stale_pages({g.METRICS_PAGE: regenerated})
                self.assertEqual(len(stale), 1)
                self.assertEqual(stale[0][0], g.METRICS_PAGE)
                self.assertIn("mmserve_router_new_gauge", stale[0][1])
            finally:
                g.ROOT = old

    def test_check_mode_names_the_page_and_how_to_regenerate(self):
        r = subprocess.run([sys.executable, os.path.join(os.path.dirname(g.__file__),
                                                         "gen_reference.py"), "--bogus"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown argument --bogus", r.stderr)


HELPFULL = """router: the router.

  Flags from absl/flags/parse.cc:
    --flagfile (comma-separated list of files to load flags from); default: ;

  Flags from router/router_main.cc:
    --api_key (API keys the public API requires (Authorization: Bearer); none:
      open); default: ;
    --host (address to listen on); default: "127.0.0.1";
    --max_video_bytes (largest video a request may carry, in bytes, before any
      decoding); default: 67108864;
"""


class HelpfullTest(unittest.TestCase):
    def test_wrapped_entries_and_sources(self):
        flags = g.parse_helpfull(HELPFULL)
        self.assertEqual(flags[0], ("absl/flags/parse.cc", "flagfile",
                                    "comma-separated list of files to load flags from", ""))
        self.assertEqual(flags[1], ("router/router_main.cc", "api_key",
                                    "API keys the public API requires (Authorization: Bearer); "
                                    "none: open", ""))
        self.assertEqual(flags[2][1:], ("host", "address to listen on", '"127.0.0.1"'))
        self.assertEqual(flags[3][3], "67108864")

    def test_the_real_router_lists_its_flags(self):
        exe = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", ""),
                           "router", "router")
        if not os.environ.get("TEST_SRCDIR"):
            self.skipTest("run under bazel test (needs //router:router)")
        out = subprocess.run([exe, "--helpfull"], capture_output=True, text=True,
                             timeout=60).stdout
        flags = {(f[0], f[1]): f for f in g.parse_helpfull(out)}
        self.assertEqual(flags[("router/router_main.cc", "port")][3], "50051")
        self.assertEqual(flags[("router/router_main.cc", "model_id")][3], '""')
        self.assertIn(("router/router_main.cc", "api_key_file"), flags)
        self.assertTrue(all(not f[0].startswith("/") for f in flags.values()))

    def test_flag_type_comes_from_the_definition(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, "x/main.cc", "ABSL_FLAG(std::vector<std::string>, names, {},\n  \"n\");\n"
                  "ABSL_FLAG(int64_t, big,\n int64_t{1} << 20, \"b\");\n")
            old = g.ROOT
            g.ROOT = root
            try:
                self.assertEqual(g.flag_type("x/main.cc", "names"), "vector<string>")
                self.assertEqual(g.flag_type("x/main.cc", "big"), "int64_t")
                with self.assertRaisesRegex(g.ReferenceError, "no ABSL_FLAG"):
                    g.flag_type("x/main.cc", "missing")
            finally:
                g.ROOT = old


if __name__ == "__main__":
    unittest.main()
