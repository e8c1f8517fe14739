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

Then two short runs with a tensor-parallel prefill arm (one length, no
sweep, no goodput): --prefill_tp=2 gives tp2_prefill_vs_ceiling and
parallel_ceiling as positive finite numbers; --prefill_tp=3, which the demo
model's 2 KV heads refuse, still prints both keys, tp3_prefill_vs_ceiling
null (that arm did not run) and parallel_ceiling a number.
"""
import json
import math
import os
import subprocess
import sys

LENGTHS = [64, 256, 1024]


def run_bench(args):
    """pd_bench's last line as a dict, or None when it failed."""
    log_dir = os.environ.get("TEST_TMPDIR", "/tmp")
    cmd = ["bench/pd_bench", "--rounds=1", "--kv_cache_mb=64", "--timeout_s=300",
           "--log_dir=" + log_dir] + args
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    sys.stdout.write(run.stdout)
    sys.stderr.write(run.stderr[-4000:])
    if run.returncode != 0:
        print("pd_bench exited with", run.returncode)
        return None
    return json.loads(run.stdout.strip().splitlines()[-1])


def positive(errors, key, value, at_most=None):
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        errors.append(f"{key} = {value!r}: not a positive finite number")
    elif at_most is not None and value > at_most:
        errors.append(f"{key} = {value!r} > {at_most}")


def check_prefill_tp(errors):
    """The --prefill_tp keys: numbers when the arms ran, null when not."""
    short = ["--lengths=128", "--sweep_lengths=", "--goodput_requests=0"]
    report = run_bench(short + ["--prefill_tp=2"])
    if report is None:
        errors.append("pd_bench --prefill_tp=2 failed")
    else:
        for key in ["tp2_prefill_vs_ceiling", "parallel_ceiling"]:
            if key not in report:
                errors.append(f"--prefill_tp=2: missing {key}")
            else:
                positive(errors, f"--prefill_tp=2: {key}", report[key])
    report = run_bench(short + ["--prefill_tp=3"])
    if report is None:
        errors.append("pd_bench --prefill_tp=3 failed")
        return
    if "tp3_prefill_vs_ceiling" not in report or report["tp3_prefill_vs_ceiling"] is not None:
        errors.append("--prefill_tp=3 (refused by the model): tp3_prefill_vs_ceiling = "
                      f"{report.get('tp3_prefill_vs_ceiling', 'missing')!r}, not null")
    if "parallel_ceiling" not in report:
        errors.append("--prefill_tp=3: missing parallel_ceiling")
    else:
        positive(errors, "--prefill_tp=3: parallel_ceiling", report["parallel_ceiling"])


def main():
    report = run_bench(["--lengths=" + ",".join(map(str, LENGTHS)), "--sweep_lengths=64,256",
                        "--layer_groups=1,all", "--goodput_requests=4",
                        "--goodput_concurrency=2", "--goodput_prompt=128",
                        "--goodput_output=4"])
    if report is None:
        return 1
    errors = []
    for key in ["goodput_pd_per_s", "goodput_both_per_s"]:
        value = report.get(key)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            errors.append(f"{key} = {value!r}: not a finite number >= 0")
    if "goodput_pd_vs_both" not in report:
        errors.append("missing goodput_pd_vs_both")
    elif report["goodput_pd_vs_both"] is not None:
        positive(errors, "goodput_pd_vs_both", report["goodput_pd_vs_both"])
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
            positive(errors, key, report[key])
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
                    positive(errors, name, sweep[group][field + k])
    for key in report:
        if key.endswith("_prefill_vs_ceiling") or key == "parallel_ceiling":
            errors.append(f"{key} printed without --prefill_tp")
    check_prefill_tp(errors)
    for e in errors:
        print("FAIL:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
