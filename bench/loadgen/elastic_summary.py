#!/usr/bin/env python3
"""The summary of bench/loadgen/elastic_experiment.sh: a table and a JSON line.

Reads the run folder the script fills (probe.jsonl, runs.jsonl,
rate_probe.jsonl, elastic_bench.jsonl, profile.jsonl) and prints, per rate and
configuration, the medians of the rounds (goodput with its range, SLO
attainment, TTFT and TPOT p99, errors, KV bytes sent), then the summary
JSON line (last): the ratios the experiment exists for, the run's dates and
load averages at start and end, and the figures per configuration.
"""
import argparse
import collections
import json
import os
import statistics

CONFIGS = ["elastic", "static_dp", "pd", "single_2t"]
WARMUP = 2  # loadgen --warmup: their KV bytes are in the counters too


def lines(path):
    if not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path) if l.startswith("{")]


def points(runs, rates):
    """Per configuration: the medians of the rounds at each rate."""
    by = collections.defaultdict(list)
    for r in runs:
        by[(r["config"], r["request_rate"])].append(r)
    print("%-6s %-10s %18s %8s %12s %12s %7s %10s" % (
        "rate", "config", "goodput (min-max)", "attain", "TTFT p99", "TPOT p99", "errors",
        "KV MB/run"))
    per = {c: [] for c in CONFIGS}
    for rate in rates:
        for c in CONFIGS:
            rs = by[(c, rate)]
            if not rs:
                continue

            def med(k):
                return statistics.median(r[k] for r in rs)

            g = [r["goodput"] for r in rs]
            kv = statistics.median(
                sum(k["sent"] for k in r.get("kv_bytes_moved", {}).values()) for r in rs)
            p = {"rate": rate, "goodput": med("goodput"), "goodput_min": min(g),
                 "goodput_max": max(g), "slo_attainment": med("slo_attainment"),
                 "ttft_p99_ms": med("ttft_p99_ms"), "tpot_p99_ms": med("tpot_p99_ms"),
                 "errors": sum(r["requests"] - r["ok"] for r in rs),
                 "leaked": sum(r.get("leaked", 0) for r in rs), "kv_bytes_sent_per_run": kv,
                 "loadavg": [r["loadavg"] for r in rs]}
            per[c].append(p)
            print("%-6g %-10s %8.2f (%.2f-%.2f) %8.2f %9.0f ms %9.1f ms %7d %10.1f" % (
                rate, c, p["goodput"], min(g), max(g), p["slo_attainment"], p["ttft_p99_ms"],
                p["tpot_p99_ms"], p["errors"], kv / 1e6))
    return per


def kv_moved(runs):
    """KV bytes sent per request (every byte sent was received elsewhere), by kind."""
    moved = {}
    for c in CONFIGS:
        rs = [r for r in runs if r["config"] == c]
        reqs = sum(r["requests"] + WARMUP for r in rs)
        kinds = collections.Counter()
        for r in rs:
            for k, v in r.get("kv_bytes_moved", {}).items():
                kinds[k] += v["sent"]
        moved[c] = {"per_request": sum(kinds.values()) / reqs if reqs else None,
                    "per_request_by_kind": {k: v / reqs for k, v in kinds.items()}
                    if reqs else None}
    return moved


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("dir", "mix", "date_start", "date_end", "loadavg_start", "loadavg_end",
                 "model", "step_models"):
        ap.add_argument("--" + name, required=True)
    for name in ("requests", "kv_mb", "knee_found", "quick"):
        ap.add_argument("--" + name, type=int, required=True)
    ap.add_argument("--knee", type=float, required=True)
    a = ap.parse_args()
    probes = {j["probe"]: j["longest_words"] for j in lines(os.path.join(a.dir, "probe.jsonl"))}
    runs = lines(os.path.join(a.dir, "runs.jsonl"))
    elastic = lines(os.path.join(a.dir, "elastic_bench.jsonl"))[-1]
    profile = lines(os.path.join(a.dir, "profile.jsonl"))
    rates = sorted({r["request_rate"] for r in runs})
    per = {c: {"longest_prompt_words": probes.get(c)} for c in CONFIGS}
    for c, pts in points(runs, rates).items():
        ok = [p["rate"] for p in pts if p["slo_attainment"] >= 0.9]
        per[c].update(points=pts, max_rate_at_90pct_slo=max(ok) if ok else None,
                      peak_goodput=max((p["goodput"] for p in pts), default=0))
    best_static = max(per["static_dp"]["peak_goodput"], per["pd"]["peak_goodput"])
    moved = kv_moved(runs)
    print("KV bytes moved per request: " + ", ".join(
        "%s %.0f" % (c, moved[c]["per_request"] or 0) for c in CONFIGS))
    loads = [x for r in runs for x in r["loadavg"]]
    first = runs[0] if runs else {}
    summary = {
        "bench": "elastic_experiment", "quick": bool(a.quick),
        "date": a.date_start, "date_end": a.date_end,
        "loadavg_start": [float(x) for x in a.loadavg_start.split()],
        "loadavg_end": [float(x) for x in a.loadavg_end.split()],
        "loadavg_min_max": [min(loads), max(loads)] if loads else None,
        "model": a.model, "requests": a.requests, "kv_mb_per_instance": a.kv_mb,
        "mix_words": [int(x) for x in a.mix.split(",")],
        "slo": {k: first.get(k) for k in ("slo_ttft_ms", "slo_ttft_ms_per_prompt_token",
                                         "slo_tpot_ms")},
        "knee_rate": a.knee, "knee_found": bool(a.knee_found), "rates": rates,
        "longest_prompt_ratio": (probes["elastic"] / probes["static_dp"]
                                 if probes.get("static_dp") else None),
        "goodput_vs_best_static": (per["elastic"]["peak_goodput"] / best_static
                                   if best_static else None),
        "ttft_dop2_vs_dop1": elastic["ttft_dop2_vs_dop1"],
        "decode_step_spread_ratio": elastic["decode_step_spread_ratio"],
        "parallel_ceiling": elastic["parallel_ceiling"],
        "kv_bytes_moved": moved, "elastic_step_models": a.step_models,
        "elastic_step_models_fit": profile[-1].get("models") if profile else None,
        "configs": per, "elastic_bench": elastic,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
