#!/usr/bin/env python3
"""The bar chart beside the README's benchmark table.

Reads docs/data/readme_bench.csv (one row per configuration; '#' lines are
comments) and writes docs/img/readme_bench.png: tokens/s for prefill (pp512),
single-sequence decode (tg128) and 32-sequence decode, one bar per row.

    python3 tools/plot_readme_bench.py [--data=CSV] [--out=PNG]

Needs matplotlib (pip install matplotlib, e.g. into a virtual environment).
"""
import argparse
import csv
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
METRICS = [("prefill_pp512", "prefill, 512-token prompt"),
           ("decode_tg128", "decode, 1 sequence"),
           ("decode_batch32", "decode, 32 sequences")]
COLORS = {"mmserve": ["#1f4e79", "#2e75b6", "#9dc3e6"], "llama.cpp": ["#7f7f7f", "#bfbfbf"]}


def read_rows(path):
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip() and not line.startswith("#")]
    return list(csv.DictReader(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.path.join(ROOT, "docs/data/readme_bench.csv"))
    parser.add_argument("--out", default=os.path.join(ROOT, "docs/img/readme_bench.png"))
    args = parser.parse_args()
    rows = read_rows(args.data)

    fig, axes = plt.subplots(1, len(METRICS), figsize=(11, 3.6))
    used = {k: 0 for k in COLORS}
    colors = []
    for r in rows:
        colors.append(COLORS[r["engine"]][used[r["engine"]] % len(COLORS[r["engine"]])])
        used[r["engine"]] += 1
    labels = [f"{r['engine']} {r['configuration']}" for r in rows]
    for ax, (key, title) in zip(axes, METRICS):
        values = [float(r[key]) for r in rows]
        y = list(range(len(rows)))[::-1]
        bars = ax.barh(y, values, color=colors)
        for bar, v in zip(bars, values):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {v:.0f}",
                    va="center", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("tokens/s")
        ax.set_xlim(0, max(values) * 1.2)
        ax.set_yticks(y)
        ax.set_yticklabels(labels if ax is axes[0] else [], fontsize=8)
        ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle("Qwen2-0.5B dimensions, CPU, 2 threads (2-vCPU AMD EPYC Zen 5), "
                 "2026-11-26", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {os.path.relpath(args.out, ROOT)}")


if __name__ == "__main__":
    main()
