#!/usr/bin/python3
"""pd_bench on the bundled demo model at short prompts, cheaply.

Runs every phase (TTFT per length, the hand-off alone and hidden, goodput,
a two-value layer-group sweep) with one round, and checks the last line:
it is JSON, every key the benchmark promises is there, and every ratio and
time is a positive finite number (a hidden fraction is at most 1), but
for the goodput ratio: with four requests an arm may meet the SLO with
none of them on a loaded machine, so it is null or positive and the two
goodputs are finite and not negative. The
tensor-parallel prefill keys are absent (not measured without
--prefill_tp).
"""
import json
import math
import os
import subprocess
import sys

LENGTHS = [64, 256, 1024]


def main():
    log_dir = os.environ.get("TEST_TMPDIR", "/tmp")
    cmd = ["bench/pd_bench", "--rounds=1", "--lengths=" + ",".join(map(str, LENGTHS)),
           "--sweep_lengths=64,256", "--layer_groups=1,all", "--goodput_requests=4",
           "--goodput_concurrency=2", "--goodput_prompt=128", "--goodput_output=4",
           "--kv_cache_mb=64", "--timeout_s=300", "--log_dir=" + log_dir]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    sys.stdout.write(run.stdout)
    sys.stderr.write(run.stderr[-4000:])
    if run.returncode != 0:
        print("pd_bench exited with", run.returncode)
        return 1
    lines = run.stdout.strip().splitlines()
    report = json.loads(lines[-1])
    errors = []

    def positive(key, value, at_most=None):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            errors.append(f"{key} = {value!r}: not a positive finite number")
        elif at_most is not None and value > at_most:
            errors.append(f"{key} = {value!r} > {at_most}")

    for key in ["goodput_pd_per_s", "goodput_both_per_s"]:
        value = report.get(key)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            errors.append(f"{key} = {value!r}: not a finite number >= 0")
    if "goodput_pd_vs_both" not in report:
        errors.append("missing goodput_pd_vs_both")
    elif report["goodput_pd_vs_both"] is not None:
        positive("goodput_pd_vs_both", report["goodput_pd_vs_both"])
    elif report.get("goodput_both_per_s") != 0:
        errors.append("goodput_pd_vs_both is null although role both's goodput is not 0")
    keys = ["throughput_pd_vs_both", "load_avg", "load_before"]
    for n in LENGTHS:
        k = f"{n // 1024}k" if n % 1024 == 0 else str(n)
        keys += [f"ttft_pd_vs_both_{k}", f"ttft_both_ms_{k}", f"handoff_alone_ms_{k}",
                 f"handoff_exposed_ms_{k}"]
    for key in keys:
        if key not in report:
            errors.append(f"missing {key}")
        elif key != "load_before" and key != "load_avg":
            positive(key, report[key])
    for key in ["handoff_hidden_fraction", "handoff_hidden_fraction_1k"]:
        value = report.get(key)
        # Hidden: below 1 by the unhidden CommitKv; may be <= 0 on a loaded
        # machine, but finite.
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value >= 1:
            errors.append(f"{key} = {value!r}: not a finite number below 1")
    sweep = report.get("sweep", {})
    for group in ["1", "all"]:
        for k in ["64", "256"]:
            for field in ["ttft_vs_whole_", "exposed_ms_", "whole_exposed_ms_"]:
                name = f"sweep.{group}.{field}{k}"
                if field + k not in sweep.get(group, {}):
                    errors.append(f"missing {name}")
                else:
                    positive(name, sweep[group][field + k])
    for key in report:
        if key.endswith("_prefill_vs_ceiling") or key == "parallel_ceiling":
            errors.append(f"{key} printed without --prefill_tp")
    for e in errors:
        print("FAIL:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
