#!/usr/bin/python3
"""Plots bench/loadgen results: latency against offered rate, and goodput.

Reads files of loadgen output (any text; every line that is a loadgen JSON
object counts), groups the runs by their "label" (one curve per label) and
writes two PNGs:

  <out>_latency.png  TTFT and E2E p50/p99 and TPOT p50/p99 against request_rate
  <out>_goodput.png  goodput and request throughput against request_rate

  tools/plot_load.py --out=docs/load run1.txt run2.txt

With --cache, the input is bench/loadgen/encoder_cache_experiment.sh output
at several rates (lines with cache_mb and cache_hit_rate; rounds at the same
rate and setting are reduced to their median) and the one PNG is

  <out>_cache.png    cache hit rate, TTFT p50 and TTFT p99 against
                     request_rate, cache on against off

Needs Debian's python3-matplotlib (no pip), hence /usr/bin/python3.
"""
import argparse
import collections
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load_runs(paths):
    runs = collections.defaultdict(list)
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    j = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if j.get("bench") != "loadgen" or "request_rate" not in j:
                    continue
                runs[j.get("label") or j.get("target", "run")].append(j)
    for label in runs:
        runs[label].sort(key=lambda j: j["request_rate"])
    return runs


def plot_cache(paths, out):
    """The encoder cache experiment: on against off at each offered rate."""
    import statistics
    by = collections.defaultdict(list)  # (on, rate) -> runs
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    j = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if j.get("bench") != "loadgen" or "cache_mb" not in j:
                    continue
                # request_rate: the offered rate (--request_rate).
                by[(j["cache_mb"] > 0, j["request_rate"])].append(j)
    if not by:
        sys.exit("plot_load.py: no encoder cache experiment lines in " + " ".join(paths))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for on, name, style in ((True, "cache on", "o-"), (False, "cache off", "s--")):
        rates = sorted(r for (o, r) in by if o == on)
        med = lambda k: [statistics.median(j[k] for j in by[(on, r)]) for r in rates]
        axes[0].plot(rates, med("cache_hit_rate"), style, label=name)
        axes[1].plot(rates, med("ttft_p50_ms"), style, label=name)
        axes[2].plot(rates, med("ttft_p99_ms"), style, label=name)
    for ax, title in zip(axes, ("encoder cache hit rate", "TTFT p50 (ms)", "TTFT p99 (ms)")):
        ax.set_title(title)
        ax.set_xlabel("offered request rate (req/s)")
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylim(-0.05, 1.05)
    fig.tight_layout()
    fig.savefig(out + "_cache.png", dpi=100)
    print("wrote " + out + "_cache.png")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="PNG path prefix")
    parser.add_argument("--cache", action="store_true",
                        help="encoder cache experiment lines: one _cache.png")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    if args.cache:
        plot_cache(args.files, args.out)
        return
    runs = load_runs(args.files)
    if not runs:
        sys.exit("plot_load.py: no loadgen JSON lines in " + " ".join(args.files))

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for label, rs in runs.items():
        rate = [r["request_rate"] for r in rs]
        for ax, metric in zip(axes, ("ttft", "tpot", "e2e")):
            ax.plot(rate, [r[metric + "_p50_ms"] for r in rs], "o-", label=label + " p50")
            ax.plot(rate, [r[metric + "_p99_ms"] for r in rs], "s--", label=label + " p99")
    for ax, metric in zip(axes, ("TTFT", "TPOT", "E2E")):
        ax.set_xlabel("offered load (req/s, Poisson)")
        ax.set_ylabel(metric + " (ms)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out + "_latency.png", dpi=110)

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for label, rs in runs.items():
        rate = [r["request_rate"] for r in rs]
        ax.plot(rate, [r["goodput"] for r in rs], "o-", label=label + " goodput")
        ax.plot(rate, [r["request_throughput"] for r in rs], "x:", label=label + " throughput")
    slo = next(iter(runs.values()))[0]
    ax.plot([0, max(r["request_rate"] for rs in runs.values() for r in rs)],
            [0, max(r["request_rate"] for rs in runs.values() for r in rs)],
            color="gray", lw=0.8, label="offered")
    ax.set_xlabel("offered load (req/s, Poisson)")
    ax.set_ylabel("req/s")
    ax.set_title("goodput: TTFT <= %g ms and TPOT <= %g ms" % (slo["slo_ttft_ms"],
                                                               slo["slo_tpot_ms"]))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out + "_goodput.png", dpi=110)
    print("plot_load.py: wrote %s_latency.png and %s_goodput.png (%d curves)" %
          (args.out, args.out, len(runs)))


if __name__ == "__main__":
    main()
