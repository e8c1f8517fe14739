#!/usr/bin/python3
"""Plots bench/loadgen results: latency against offered rate, and goodput.

Reads files of loadgen output (any text; every line that is a loadgen JSON
object counts), groups the runs by their "label" (one curve per label) and
writes two PNGs:

  <out>_latency.png  TTFT and E2E p50/p99 and TPOT p50/p99 against request_rate
  <out>_goodput.png  goodput and request throughput against request_rate

  tools/plot_load.py --out=docs/load run1.txt run2.txt

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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="PNG path prefix")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
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
