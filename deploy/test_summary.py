#!/usr/bin/env python3
"""Counts test cases across the Bazel test logs and prints one closing line.

Usage: test_summary.py TESTLOGS_DIR BAZEL_OUTPUT_FILE
                       [--run=LABEL,BAZEL_OUTPUT_FILE[,TESTLOGS_DIR] ...] [EXTRA_RESULT ...]

Each Catch2 binary's log ends with either "All tests passed (A assertions in
N test cases)" or "test cases: N | P passed | F failed"; those test cases are
counted. A target whose log has no such line (a crash, a timeout, a non-Catch2
test) counts as one test, passed or failed as Bazel reported it. EXTRA_RESULT
is "name=passed", "name=failed" or "name=skipped" for checks run outside
`bazel test`; skipped ones are listed and counted on their own line, never
as passed. --run adds another `bazel test` over the same targets (e.g. the
ASan build): each of its targets counts as one test, passed or failed as
Bazel reported it, listed as "LABEL //target"; with its TESTLOGS_DIR, its
failed and flaky targets get their reasons too.
Under each failed or flaky target come the lines of its log that say why
(Catch2's failed assertions with their expansions and messages, sanitizer
reports, Bazel's timeout line; else the log's last lines; for a stack test,
the last warnings of each service log it left in test.outputs), and they are
repeated at the end, just above the closing line, so that a CI view that
shows only the tail still shows the reason.
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


REASON = re.compile(r"FAILED:|ERROR: (Address|Leak|Undefined)Sanitizer|runtime error:|"
                    r"SUMMARY: |WARNING: ThreadSanitizer|Test timed out|unexpected exception|"
                    r"fatal error condition|terminate called|Check failed")
MAX_REASON_LINES = 24
SERVICE_WARNING = re.compile(r"^[WEF]\d{4} ")  # glog's warning, error and fatal lines
SERVICE_LINES = 3  # per service log


def failure_reason(testlogs, target, status):
    """The lines of the target's log that say why it failed (for a flaky
    target, its first attempt's log)."""
    if not testlogs:
        return []
    path = log_path(testlogs, target)
    if status == "FLAKY":
        attempt = os.path.join(os.path.dirname(path), "test_attempts", "attempt_1.log")
        if os.path.exists(attempt):
            path = attempt
    if not os.path.exists(path):
        return [f"(no log at {path})"]
    with open(path, errors="replace") as f:
        lines = [l.rstrip() for l in f]
    picked = []
    i = 0
    while i < len(lines) and len(picked) < MAX_REASON_LINES:
        if REASON.search(lines[i]):
            # The line and what follows it up to the next blank line (a
            # Catch2 expansion and its messages, a sanitizer's first frames).
            j = i
            while j < len(lines) and j < i + 14 and (j == i or lines[j].strip()):
                picked.append(lines[j])
                j += 1
            i = j
        else:
            i += 1
    if not picked:
        picked = [l for l in lines if l.strip()][-8:]
    picked = picked[:MAX_REASON_LINES]
    # A stack test's services log beside it: their last warnings and errors
    # (an instance leaving placement, a backend's failure) say what the
    # client's status does not.
    outputs = os.path.join(os.path.dirname(log_path(testlogs, target)), "test.outputs")
    if os.path.isdir(outputs):
        for name in sorted(os.listdir(outputs)):
            if not name.endswith(".log"):
                continue
            with open(os.path.join(outputs, name), errors="replace") as f:
                warnings = [l.rstrip() for l in f if SERVICE_WARNING.match(l)]
            picked += [f"{name}: {l}" for l in warnings[-SERVICE_LINES:]]
    return [l[:240] for l in picked]


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
    runs = [a[len("--run="):].split(",", 2) for a in sys.argv[3:] if a.startswith("--run=")]
    extras = [a for a in sys.argv[3:] if not a.startswith("--run=")]
    statuses = read_statuses(bazel_output)
    passed = failed = 0
    rows = []
    reasons = []  # (name, lines) of each failed or flaky target

    def add_reason(name, testlogs, target, status):
        if status in ("PASSED", "SKIPPED"):
            return
        lines = failure_reason(testlogs, target, status)
        rows.extend("      | " + l for l in lines)
        reasons.append((name, status, lines))

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
        add_reason(target, testlogs, target, status)
    for run in runs:
        label, output = run[0], run[1]
        run_testlogs = run[2] if len(run) > 2 else None
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
            add_reason(f"{label} {target}", run_testlogs, target, status)
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
    if reasons:
        print("why (failed and flaky targets; each also under its row above):")
        for name, status, lines in reasons:
            print(f"  {status} {name}")
            print("\n".join("      | " + l for l in lines))
    flaky = [name for name, status, _ in reasons if status == "FLAKY"]
    if flaky:
        print(f"flaky (passed on a later attempt, counted as passed): {len(flaky)}: "
              f"{', '.join(flaky)}")
    if skipped:
        print(f"skipped (not counted): {len(skipped)}: {', '.join(skipped)}")
    print(f"tests: {passed} passed, {failed} failed")
    return 0 if failed == 0 and statuses else 1


if __name__ == "__main__":
    sys.exit(main())
