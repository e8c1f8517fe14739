#!/usr/bin/env python3
"""Counts test cases across the Bazel test logs and prints one closing line.

Usage: test_summary.py TESTLOGS_DIR BAZEL_OUTPUT_FILE [--run=LABEL,BAZEL_OUTPUT_FILE ...]
                       [EXTRA_RESULT ...]

Each Catch2 binary's log ends with either "All tests passed (A assertions in
N test cases)" or "test cases: N | P passed | F failed"; those test cases are
counted. A target whose log has no such line (a crash, a timeout, a non-Catch2
test) counts as one test, passed or failed as Bazel reported it. EXTRA_RESULT
is "name=passed", "name=failed" or "name=skipped" for checks run outside
`bazel test`; skipped ones are listed and counted on their own line, never
as passed. --run adds another `bazel test` over the same targets (e.g. the
ASan build): each of its targets counts as one test, passed or failed as
Bazel reported it, listed as "LABEL //target".
Property-test lines ("[property] ...") are echoed so their seeds and
iteration counts show in CI output. Exit status: 0 when nothing failed.
"""
import os
import re
import sys

ALL_PASSED = re.compile(r"All tests passed \((\d+) assertions? in (\d+) test cases?\)")
MIXED = re.compile(r"test cases:\s*(\d+)\s*\|\s*(?:(\d+) passed)?\s*\|?\s*(?:(\d+) failed)?")
STATUS = re.compile(r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|"
                    r"FAILED TO BUILD|INCOMPLETE|SKIPPED)")


def log_path(testlogs, target):
    pkg, name = target[2:].split(":")
    return os.path.join(testlogs, pkg, name, "test.log")


def read_statuses(bazel_output):
    statuses = {}
    with open(bazel_output, errors="replace") as f:
        for line in f:
            m = STATUS.match(line.strip())
            if m:
                statuses[m.group(1)] = m.group(2)
    return statuses


def main():
    testlogs, bazel_output = sys.argv[1], sys.argv[2]
    runs = [a[len("--run="):].split(",", 1) for a in sys.argv[3:] if a.startswith("--run=")]
    extras = [a for a in sys.argv[3:] if not a.startswith("--run=")]
    statuses = read_statuses(bazel_output)
    passed = failed = 0
    rows = []
    for target, status in sorted(statuses.items()):
        if status == "SKIPPED":
            continue
        p = f = None
        path = log_path(testlogs, target)
        if os.path.exists(path):
            with open(path, errors="replace") as log:
                for line in log:
                    if line.startswith("[property]"):
                        print(f"  {target}: {line.rstrip()}")
                    m = ALL_PASSED.search(line)
                    if m:
                        p, f = int(m.group(2)), 0
                    m = MIXED.search(line)
                    if m:
                        total = int(m.group(1))
                        f = int(m.group(3) or 0)
                        p = int(m.group(2) or (total - f))
        if p is None:
            p, f = (1, 0) if status in ("PASSED", "FLAKY") else (0, 1)
        elif status not in ("PASSED", "FLAKY") and f == 0:
            f = 1  # the binary failed after its cases passed (crash, leak, timeout)
        passed += p
        failed += f
        rows.append(f"  {status:<8} {target}: {p} passed, {f} failed")
    for label, output in runs:
        run_statuses = read_statuses(output) if os.path.exists(output) else {}
        if not run_statuses:
            failed += 1
            rows.append(f"  {'FAILED':<8} {label}: no test results")
        for target, status in sorted(run_statuses.items()):
            if status == "SKIPPED":
                continue
            ok = status in ("PASSED", "FLAKY")
            passed += ok
            failed += not ok
            rows.append(f"  {status:<8} {label} {target}")
    skipped = []
    for extra in extras:
        name, result = extra.rsplit("=", 1)
        if result == "skipped":
            skipped.append(name)
            rows.append(f"  {'SKIPPED':<8} {name}")
            continue
        ok = result == "passed"
        passed += ok
        failed += not ok
        rows.append(f"  {'PASSED' if ok else 'FAILED':<8} {name}")
    print("\n".join(rows))
    if skipped:
        print(f"skipped (not counted): {len(skipped)}: {', '.join(skipped)}")
    print(f"tests: {passed} passed, {failed} failed")
    return 0 if failed == 0 and statuses else 1


if __name__ == "__main__":
    sys.exit(main())
