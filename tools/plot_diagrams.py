#!/usr/bin/env python3
"""The architecture page's diagrams, drawn with matplotlib.

Writes docs/img/pd_tp_handoff.png (one request through a prefill instance
and a tensor-parallel decode instance) and docs/img/elastic_group.png (a
long prompt prefilled by an elastic group, then decoded by its master).

    python3 tools/plot_diagrams.py [--out_dir=docs/img]

Needs matplotlib (pip install matplotlib, e.g. into a virtual environment).
The boxes and arrows follow docs/architecture.md; change both together.
"""
import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PROCESS = "#dbe9f6"
RANK = "#f2f2f2"
GRPC = "#1f4e79"
UCX = "#c55a11"


def box(ax, x, y, w, h, title, body="", color=PROCESS, title_size=10):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                fc=color, ec="#404040", lw=1.0))
    ax.text(x + w / 2, y + h - 0.12, title, ha="center", va="top", fontsize=title_size,
            fontweight="bold")
    if body:
        ax.text(x + w / 2, y + h - 0.42, body, ha="center", va="top", fontsize=8,
                linespacing=1.35)


def arrow(ax, start, end, label="", color=GRPC, style="-|>", dashed=False, offset=(0, 0.1),
          ha="center", rad=0.0, size=8):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, lw=1.4,
                                 color=color, linestyle="--" if dashed else "-",
                                 connectionstyle=f"arc3,rad={rad}", shrinkA=2, shrinkB=2))
    if label:
        mx, my = (start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1]
        ax.text(mx, my, label, ha=ha, va="bottom", fontsize=size, color=color,
                bbox=dict(fc="white", ec="none", pad=0.5, alpha=0.85))


def legend(ax, x, y):
    ax.plot([x, x + 0.4], [y, y], color=GRPC, lw=1.4)
    ax.text(x + 0.5, y, "gRPC", va="center", fontsize=8, color=GRPC)
    ax.plot([x + 1.3, x + 1.7], [y, y], color=UCX, lw=1.4)
    ax.text(x + 1.8, y, "UCX (shm or tcp)", va="center", fontsize=8, color=UCX)


def canvas(w, h):
    fig, ax = plt.subplots(figsize=(w, h))
    ax.set_xlim(0, w)
    ax.set_ylim(0, h)
    ax.axis("off")
    return fig, ax


def pd_tp_handoff(path):
    fig, ax = canvas(11, 6.4)
    ax.text(0.2, 6.15, "One request on  --prefill=1 --decode=1 --tp=2", fontsize=12,
            fontweight="bold")
    legend(ax, 7.6, 6.2)
    box(ax, 4.3, 4.75, 2.4, 1.05, "router",
        "places the decode instance first,\nthen the least loaded prefill one")
    box(ax, 0.2, 2.35, 2.3, 1.3, "encoder", "decode + resize,\nvision tower, cache")
    box(ax, 3.2, 2.05, 2.6, 1.9, "prefill instance", "one rank, all KV heads:\nchat, tokenize, prefill,\n"
        "first token")
    box(ax, 7.0, 0.25, 3.8, 3.95, "decode instance  (--tp=2)", "", title_size=10)
    box(ax, 7.25, 2.15, 3.3, 1.45, "rank 0", "gRPC, scheduler, sampler\nKV cache: heads 0 .. h/2-1",
        color=RANK, title_size=9)
    box(ax, 7.25, 0.45, 3.3, 1.45, "rank 1  (//worker:tp_shard)", "KV cache: heads h/2 .. h-1",
        color=RANK, title_size=9)
    ax.text(10.95, 1.85, "step ring +\nall-reduce\n(shared memory)", fontsize=7, ha="left",
            va="center", color="#404040")

    arrow(ax, (6.3, 4.75), (8.6, 3.62), "1  Decode: hold the request", rad=-0.15,
          offset=(0.55, 0.1))
    arrow(ax, (4.75, 4.75), (4.75, 3.97), "2  Prefill", offset=(-0.1, -0.1), ha="right")
    arrow(ax, (4.3, 5.1), (1.35, 3.67), "Encode (image bytes)", rad=0.15, offset=(-0.9, 0.35))
    arrow(ax, (2.5, 3.0), (3.2, 3.0), "3  embeddings", color=UCX, offset=(0.0, 0.1))
    arrow(ax, (5.8, 3.55), (7.25, 3.35), "4  AllocateKv", offset=(0.0, 0.05))
    ax.text(6.2, 3.0, "one target per rank", fontsize=7, color=GRPC, ha="center")
    arrow(ax, (5.8, 2.75), (7.25, 2.55), "5  KV, heads of rank 0", color=UCX, offset=(0, -0.3))
    arrow(ax, (5.8, 2.2), (7.25, 1.2), "5  KV, heads of rank 1", color=UCX, offset=(0.15, -0.05),
          ha="right")
    arrow(ax, (5.3, 2.05), (7.25, 0.75), "6  CommitKv: first token,\n    one CRC32C per rank",
          offset=(-0.9, -0.95), rad=0.25)
    arrow(ax, (5.25, 3.97), (5.25, 4.75), "first token", dashed=True, offset=(0.1, -0.1),
          ha="left")
    arrow(ax, (9.3, 3.62), (6.7, 5.15), "7  tokens 2..n", dashed=True, rad=0.2,
          offset=(1.25, 0.3))
    ax.text(0.2, 0.95, "KV moves prefill -> decode without passing through the router or\n"
            "rank 0: each decode rank receives only its own KV heads, straight into\n"
            "its cache (shm: copied into the mapped cache; tcp: landed by rendezvous).\n"
            "Dashed: the token stream back to the client.", fontsize=8, va="center",
            color="#404040")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def elastic_group(path):
    fig, ax = canvas(11, 6.6)
    ax.text(0.2, 6.35, "A long prompt on  --elastic=3  (router --elastic)", fontsize=12,
            fontweight="bold")
    legend(ax, 7.6, 6.4)
    box(ax, 3.3, 4.65, 4.4, 1.35, "router: elastic manager",
        "FCFS queue; finds KV slots for prompt + max_tokens;\ngroup degree from step-time models;"
        " span map")
    xs = [0.3, 3.9, 7.5]
    names = ["instance A", "instance B", "instance C"]
    bodies = ["rows 0 .. n/3-1\nkeeps KV span 1",
              "rows n/3 .. 2n/3-1\nkeeps KV span 2",
              "rows 2n/3 .. n-1\nkeeps span 3 + decode tail\nsamples the first token\n= master"]
    for x, name, body in zip(xs, names, bodies):
        box(ax, x, 1.55, 3.0, 1.75, f"{name}  (--role=elastic)", body, title_size=9)
    for x in xs:
        arrow(ax, (5.5, 4.65), (x + 1.5, 3.3), "", rad=0.0)
    ax.text(5.55, 3.9, "1  ElasticPrefill(plan, member) to each member", fontsize=8, color=GRPC,
            ha="center", bbox=dict(fc="white", ec="none", pad=0.5))
    arrow(ax, (3.3, 2.55), (3.9, 2.55), "", color=UCX, style="<|-|>")
    arrow(ax, (6.9, 2.55), (7.5, 2.55), "", color=UCX, style="<|-|>")
    arrow(ax, (1.8, 1.55), (9.0, 1.55), "", color=UCX, style="<|-|>", rad=0.18)
    ax.text(0.3, -0.05, "2  (solid) prefill, per layer: all-gather of K/V among the members "
            "(puts, then a CRC32C notice)", fontsize=8, color=UCX)
    arrow(ax, (8.6, 1.55), (5.4, 1.55), "", color=UCX, style="-|>", dashed=True, rad=-0.45)
    arrow(ax, (8.0, 1.55), (1.8, 1.55), "", color=UCX, style="-|>", dashed=True, rad=-0.35)
    ax.text(0.3, -0.4, "3  (dashed) decode: the master queries each span holder per layer and "
            "merges their partial attention (output, log-sum-exp)", fontsize=8, color=UCX)
    arrow(ax, (9.3, 3.3), (7.7, 5.0), "4  tokens", dashed=True, rad=-0.2, offset=(0.7, 0.0))
    ax.text(0.3, -0.85, "No KV is copied after the prefill: each member keeps the rows of its "
            "own span (proactive scale-down). A plan may give\nthe decode tail to several "
            "members: the master then moves (ElasticMoveMaster), again without moving KV.",
            fontsize=8, va="top", color="#404040")
    ax.set_ylim(-1.4, 6.6)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out_dir", default=os.path.join(ROOT, "docs/img"))
    args = parser.parse_args()
    for name, draw in (("pd_tp_handoff.png", pd_tp_handoff),
                       ("elastic_group.png", elastic_group)):
        path = os.path.join(args.out_dir, name)
        draw(path)
        print(f"wrote {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
