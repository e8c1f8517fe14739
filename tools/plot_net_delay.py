#!/usr/bin/env python3
"""Plots bench/loadgen:net_delay_bench: latency, goodput and round trips
against the one-way delay added to every link.

Reads the bench's output (any text; its last line whose "bench" is
"net_delay_bench" counts) and writes one PNG with four panels:

  TTFT p50/p99, TPOT p50/p99, goodput, and the round trips per request
  (counted by the services' metrics + the client's call, against inferred
  from TTFT growth / (2 x delay)), each against delay_ms.

  bazel run //bench/loadgen:net_delay_bench > /tmp/net_delay.txt
  /root/.cache/mmserve-tools-venv/bin/python tools/plot_net_delay.py \
      --out=docs/img/net_delay.png /tmp/net_delay.txt

Needs matplotlib (the tools venv: pip install matplotlib).
"""
import argparse
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from plot_load import json_lines  # noqa: E402


def read_summary(path):
    """The last net_delay_bench summary line of `path`."""
    found = None
    for j in json_lines([path]):
        if j.get("bench") == "net_delay_bench" and j.get("runs"):
            found = j
    if found is None:
        sys.exit(f"{path}: no net_delay_bench summary line")
    return found


def plot(summary, out, title):
    runs = sorted(summary["runs"], key=lambda r: r["delay_ms"])
    d = [r["delay_ms"] for r in runs]
    fig, ax = plt.subplots(1, 4, figsize=(13, 3.2))
    panels = [
        ("TTFT (ms)", [("ttft_p50_ms", "p50"), ("ttft_p99_ms", "p99")]),
        ("TPOT (ms)", [("tpot_p50_ms", "p50"), ("tpot_p99_ms", "p99")]),
        ("goodput (req/s)", [("goodput", "goodput"), ("request_throughput", "throughput")]),
        ("round trips / request", [("round_trips_counted", "counted (metrics + client)"),
                                   ("round_trips_inferred", "inferred (TTFT growth / 2d)")]),
    ]
    for a, (ylabel, series) in zip(ax, panels):
        for key, label in series:
            xs = [x for x, r in zip(d, runs) if key in r and not (key.endswith("inferred") and x == 0)]
            ys = [r[key] for x, r in zip(d, runs)
                  if key in r and not (key.endswith("inferred") and x == 0)]
            a.plot(xs, ys, marker="o", label=label)
        a.set_xlabel("one-way delay per link (ms)")
        a.set_ylabel(ylabel)
        a.set_xticks(d)
        a.grid(True, alpha=0.3)
        a.legend(fontsize=7)
    ax[3].set_ylim(bottom=0)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=72)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("input", help="net_delay_bench output")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--title", default="", help="figure title")
    args = p.parse_args()
    s = read_summary(args.input)
    title = args.title or (
        f"net_delay_bench: role(s) {','.join(s.get('roles', []))}, {s.get('num_requests')} demo "
        f"requests at concurrency {s.get('max_concurrency')}, jitter +-{s.get('jitter_share', 0):.0%}")
    plot(s, args.out, title)


if __name__ == "__main__":
    main()
