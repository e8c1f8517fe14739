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

With --disagg, the input is bench/loadgen/disagg_experiment.sh output (lines
with config and mix; rounds reduced to their median, their min-max drawn as
error bars; lines with a "sweep" field get their own row) and the one PNG is

  <out>_disagg.png   per mix (one row each): goodput, TTFT p99 and TPOT p99
                     against request_rate, colocated against disaggregated

With --elastic, the input is bench/loadgen/elastic_experiment.sh output (its loadgen
lines with "config", its probe lines and its summary line; rounds reduced to
their median, min-max as error bars) and the one PNG is

  <out>_elastic.png      goodput, SLO attainment and TTFT p99 against
                     request_rate for elastic, static data parallel, P/D
                     and one 2-thread instance, and the longest prompt each
                     served (probe), with elastic_bench's ratios in the title

With --seed003, the input is bench:seed003_bench output (its JSON lines;
runs with the same label and interval are reduced to their median, their
min-max drawn as error bars) and the one PNG is

  <out>_seed003.png  ITL p99, TTFT p50, TTFT p99 and output tok/s against
                     the arrival interval, prefill budget against none,
                     one curve pair per label

Needs Debian's python3-matplotlib (no pip), hence /usr/bin/python3.
"""
import argparse
import collections
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def json_lines(paths):
    """Every line of the files that is a JSON object, parsed (others skipped)."""
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue


def median_and_range(vals):
    """Per list of rounds: the medians, and errorbar's [below, above] spans."""
    import statistics
    med = [statistics.median(v) for v in vals]
    return med, [[m - min(v) for m, v in zip(med, vals)], [max(v) - m for m, v in zip(med, vals)]]


def log2_rate_axes(axes, titles, xlabel, legend_size):
    """Titles, a log2 x axis, a grid and a legend on each of the axes."""
    for ax, title in zip(axes, titles):
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=legend_size)


def load_runs(paths):
    runs = collections.defaultdict(list)
    for j in json_lines(paths):
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
    for j in json_lines(paths):
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
    log2_rate_axes(axes, ("encoder cache hit rate", "TTFT p50 (ms)", "TTFT p99 (ms)"),
                   "offered request rate (req/s)", 8)
    axes[0].set_ylim(-0.05, 1.05)
    fig.tight_layout()
    fig.savefig(out + "_cache.png", dpi=100)
    print("wrote " + out + "_cache.png")


def plot_disagg(paths, out):
    """Colocated against disaggregated: goodput and tail latencies per mix."""
    by = collections.defaultdict(list)  # (mix, config, rate) -> runs
    slo = None
    for j in json_lines(paths):
        if j.get("bench") != "loadgen" or "config" not in j or "mix" not in j:
            continue
        # A "sweep" field (a later repeat, another setting) makes
        # its own row.
        mix = j["mix"] + (" (%s)" % j["sweep"] if j.get("sweep") else "")
        by[(mix, j["config"], j["request_rate"])].append(j)
        slo = (j["slo_ttft_ms"], j["slo_tpot_ms"])
    if not by:
        sys.exit("plot_load.py: no disaggregation experiment lines in " + " ".join(paths))
    mixes = sorted({m for (m, _, _) in by})
    fig, axes = plt.subplots(len(mixes), 3, figsize=(15, 4.2 * len(mixes)), squeeze=False)
    for row, mix in zip(axes, mixes):
        for config, style in (("colocated", "o-"), ("disaggregated", "s--")):
            rates = sorted(r for (m, c, r) in by if m == mix and c == config)
            if not rates:
                continue
            for ax, key in zip(row, ("goodput", "ttft_p99_ms", "tpot_p99_ms")):
                vals = [[j[key] for j in by[(mix, config, r)]] for r in rates]
                med, err = median_and_range(vals)
                ax.errorbar(rates, med, yerr=err, fmt=style, capsize=3,
                            label="E + language (both)" if config == "colocated" else "E + P + D")
        row[0].plot([0, max(r for (m, _, r) in by if m == mix)],
                    [0, max(r for (m, _, r) in by if m == mix)], color="gray", lw=0.8,
                    label="offered")
        for ax, title in zip(row, ("goodput (req/s)", "TTFT p99 (ms)", "TPOT p99 (ms)")):
            ax.set_title("%s: %s" % (mix, title), fontsize=10)
            ax.set_xlabel("offered load (req/s, Poisson)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        row[1].set_yscale("log")
        row[2].set_yscale("log")
        row[1].axhline(slo[0], color="red", lw=0.8, ls=":")
        row[2].axhline(slo[1], color="red", lw=0.8, ls=":")
    fig.suptitle("SLO: TTFT <= %g ms and TPOT <= %g ms (red); median of the rounds, bars min-max"
                 % slo)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / (4.2 * len(mixes))))
    fig.savefig(out + "_disagg.png", dpi=100)
    print("wrote " + out + "_disagg.png")


ELASTIC_CONFIGS = (("elastic", "elastic 2 x 1 thread (router --elastic)", "o-"),
               ("static_dp", "static data parallel 2 x 1", "s--"),
               ("pd", "P/D 1 + 1", "^:"),
               ("single_2t", "one instance, 2 threads", "x-."))


def plot_elastic(paths, out):
    """Elastic sequence parallelism against the static configurations."""
    by = collections.defaultdict(list)  # (config, rate) -> runs
    probes, summary = {}, None
    for j in json_lines(paths):
        if j.get("bench") == "loadgen" and "config" in j:
            by[(j["config"], j["request_rate"])].append(j)
        elif "probe" in j:
            probes[j["probe"]] = j["longest_words"]
        elif j.get("bench") == "elastic_experiment":
            summary = j
    if not by:
        sys.exit("plot_load.py: no elastic experiment lines in " + " ".join(paths))
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    for config, name, style in ELASTIC_CONFIGS:
        rates = sorted(r for (c, r) in by if c == config)
        for ax, key in zip(axes, ("goodput", "slo_attainment", "ttft_p99_ms")):
            vals = [[j[key] for j in by[(config, r)]] for r in rates]
            med, err = median_and_range(vals)
            ax.errorbar(rates, med, yerr=err, fmt=style, capsize=3, label=name)
    axes[1].axhline(0.9, color="red", lw=0.8, ls=":")
    axes[2].set_yscale("log")
    log2_rate_axes(axes, ("goodput (req/s)", "SLO attainment", "TTFT p99 (ms)"),
                   "offered load (req/s, Poisson)", 7)
    names = [c for c, _, _ in ELASTIC_CONFIGS if c in probes]
    axes[3].bar(range(len(names)), [probes[c] for c in names], color="tab:blue")
    axes[3].set_xticks(range(len(names)))
    axes[3].set_xticklabels(names, fontsize=8)
    axes[3].set_title("longest prompt served (words, probe)")
    axes[3].grid(True, axis="y", alpha=0.3)
    j = next(iter(by.values()))[0]
    title = "SLO: TTFT <= max(%g ms, %g ms x prompt words), TPOT <= %g ms" % (
        j["slo_ttft_ms"], j.get("slo_ttft_ms_per_prompt_token", 0), j["slo_tpot_ms"])
    if summary:
        title += ("; elastic_bench: TTFT dop2 %.2fx faster, decode spread %.2fx, ceiling %.2f; "
                  "load avg %.1f-%.1f" % (summary["ttft_dop2_vs_dop1"],
                                          summary["decode_step_spread_ratio"],
                                          summary["parallel_ceiling"],
                                          *summary["loadavg_min_max"]))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out + "_elastic.png", dpi=80)
    print("wrote " + out + "_elastic.png")


def plot_seed003(paths, out):
    """Seed 003: a prefill token budget against none, per arrival interval."""
    by = collections.defaultdict(list)  # (label, interval_ms) -> runs
    for j in json_lines(paths):
        if j.get("bench") == "seed003_bench":
            by[(j["label"], j["interval_ms"])].append(j)
    if not by:
        sys.exit("plot_load.py: no seed003_bench lines in " + " ".join(paths))
    metrics = (("itl_p99_ms", "ITL p99 (ms)"), ("ttft_p50_ms", "TTFT p50 (ms)"),
               ("ttft_p99_ms", "TTFT p99 (ms)"), ("tok_s", "output tokens/s"))
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4.5))
    for label in sorted({lab for (lab, _) in by}):
        xs = sorted(i for (lab, i) in by if lab == label)
        for arm, name, style in (("none", "no budget", "s--"), ("budget_arm", "budget", "o-")):
            for ax, (key, _) in zip(axes, metrics):
                vals = [[j[arm][key] for j in by[(label, x)]] for x in xs]
                med, err = median_and_range(vals)
                ax.errorbar(xs, med, yerr=err, fmt=style, capsize=3,
                            label="%s, %s (budget %d)" % (label, name,
                                                          by[(label, xs[0])][0]["budget"]))
    for ax, (_, title) in zip(axes, metrics):
        ax.set_title(title)
        ax.set_xlabel("arrival interval (ms, fixed)")
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("prefill token budget against none (language instance alone; "
                 "median of runs, bars min-max)")
    fig.tight_layout()
    fig.savefig(out + "_seed003.png", dpi=100)
    print("wrote " + out + "_seed003.png")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="PNG path prefix")
    parser.add_argument("--cache", action="store_true",
                        help="encoder cache experiment lines: one _cache.png")
    parser.add_argument("--disagg", action="store_true",
                        help="disaggregation experiment lines: one _disagg.png")
    parser.add_argument("--seed003", action="store_true",
                        help="bench:seed003_bench lines: one _seed003.png")
    parser.add_argument("--elastic", action="store_true",
                        help="elastic experiment lines: one _elastic.png")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    if args.elastic:
        plot_elastic(args.files, args.out)
        return
    if args.seed003:
        plot_seed003(args.files, args.out)
        return
    if args.disagg:
        plot_disagg(args.files, args.out)
        return
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
