#!/usr/bin/env python3
"""The table and JSON line of bench/peer/llamacpp_side_by_side.sh.

Reads the raw outputs of its rounds from --dir:
  r<i>.lm.<dtype>-<activations>.json   lm_bench's last JSON line
  r<i>.llama-bench.<type>.json         llama-bench -o json (pp512, tg128)
  r<i>.batched.<type>.jsonl            llama-batched-bench --output-format jsonl
and prints the medians over rounds as a table, then one JSON line last with
the ratios (mmserve / llama.cpp, same machine, same run):
  pp_vs_llamacpp_best        best pp512 of any mode / llama.cpp's best type
  pp_bf16_vs_llamacpp_bf16   bf16 weights with bf16 activations / bf16
  pp_int8_vs_q8_0            int8 weights with int8 activations / Q8_0
  tg_int8_vs_q8_0            tg128, int8 (int16 activations: the serving
                             default) / Q8_0
  tg_bf16_vs_llamacpp_bf16   tg128, bf16 weights, bf16 activations / bf16
  batch32_vs_llamacpp_best   decode of 32 sequences, best of each side
  int4_tg_vs_q4_0            tg128, int4_g32 / Q4_0 (both symmetric, a scale
                             per 32 weights)
  int4_tg_vs_q4_k            tg128, int4_g32_zp / Q4_K (both a scale and an
                             offset per 32 weights; Q4_K only where rows
                             are a multiple of 256 wide, see the script)
  int4_batch32_vs_q4_0       the same pairs, decode of 32 sequences
  int4_batch32_vs_q4_k
The table shows every mode, so the other pairings can be read from it.
"""

import argparse
import glob
import json
import os
import re
import statistics

MM_MODES = {  # file tag -> label
    "bf16-f32": "bf16 weights, f32 act",
    "bf16-bf16": "bf16 weights, bf16 act",
    "int8-f32": "int8 weights, int16 act",
    "int8-int8": "int8 weights, int8 act",
    "int4_g32-int8": "int4 g32 weights, int8 act",
    "int4_g128-int8": "int4 g128 weights, int8 act",
    "int4_g32_zp-int8": "int4 g32 zp weights, int8 act",
    "int4_g128_zp-int8": "int4 g128 zp weights, int8 act",
}
LC_TYPES = ["bf16", "f16", "q8_0", "q4_0", "q4_k"]


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def read_mm(d):
    """{mode: {metric: [per-round values]}} from lm_bench's JSON lines."""
    res = {}
    for path in sorted(glob.glob(os.path.join(d, "r*.lm.*.json"))):
        mode = re.match(r"r\d+\.lm\.(.+)\.json$", os.path.basename(path)).group(1)
        with open(path) as f:
            text = f.read().strip()
        if not text.startswith("{"):
            continue
        j = json.loads(text)
        m = res.setdefault(mode, {"pp": [], "tg": [], "b32": [], "isa": j.get("isa", "?")})
        m["pp"].append(j["pp512_tok_s"])
        m["tg"].append(j["tg128_tok_s"])
        m["b32"].append(j["batch32_tok_s"])
    return res


def read_lc(d):
    """{type: {metric: [per-round values]}} from llama-bench and batched-bench."""
    res = {t: {"pp": [], "tg": [], "b1": [], "b8": [], "b32": []} for t in LC_TYPES}
    for t in LC_TYPES:
        for path in sorted(glob.glob(os.path.join(d, f"r*.llama-bench.{t}.json"))):
            with open(path) as f:
                text = f.read().strip()
            for test in json.loads(text) if text else []:
                if test["n_prompt"] > 0 and test["n_gen"] == 0:
                    res[t]["pp"].append(test["avg_ts"])
                elif test["n_gen"] > 0 and test["n_prompt"] == 0:
                    res[t]["tg"].append(test["avg_ts"])
        for path in sorted(glob.glob(os.path.join(d, f"r*.batched.{t}.jsonl"))):
            with open(path) as f:
                for line in f:
                    j = json.loads(line)
                    key = {1: "b1", 8: "b8", 32: "b32"}.get(j["pl"])
                    if key:
                        res[t][key].append(j["speed_tg"])
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llamacpp", default="llama.cpp")
    p.add_argument("--dims", default="qwen2-0.5b")
    args = p.parse_args()
    mm, lc = read_mm(args.dir), read_lc(args.dir)

    def med(side, key, metric):
        return median(side.get(key, {}).get(metric, []))

    rounds = max([len(v["pp"]) for v in mm.values()] + [0])
    print(f"mmserve lm_bench vs {args.llamacpp}, {args.dims} dims, random weights, "
          f"{args.threads} threads, medians of {rounds} interleaved rounds (tok/s)")
    print(f"  {'side':<48}{'pp512':>10}{'tg128':>10}{'batch 8':>10}{'batch 32':>10}")
    for mode, label in MM_MODES.items():
        if mode in mm:
            print(f"  {'mmserve ' + label + ' (' + mm[mode]['isa'] + ')':<48}"
                  f"{med(mm, mode, 'pp'):>10.1f}{med(mm, mode, 'tg'):>10.2f}{'':>10}"
                  f"{med(mm, mode, 'b32'):>10.1f}")
    for t in LC_TYPES:
        print(f"  {'llama.cpp ' + t:<48}{med(lc, t, 'pp'):>10.1f}{med(lc, t, 'tg'):>10.2f}"
              f"{med(lc, t, 'b8'):>10.1f}{med(lc, t, 'b32'):>10.1f}")

    def best(side, keys, metric):
        vals = [med(side, k, metric) for k in keys if side.get(k, {}).get(metric)]
        return max(vals) if vals else float("nan")

    def ratio(a, b):
        return round(a / b, 3) if b and a == a and b == b else None

    out = {
        "bench": "llamacpp_side_by_side",
        "llamacpp": args.llamacpp,
        "dims": args.dims,
        "threads": args.threads,
        "rounds": rounds,
        "pp_vs_llamacpp_best": ratio(best(mm, MM_MODES, "pp"), best(lc, LC_TYPES, "pp")),
        "pp_bf16_vs_llamacpp_bf16": ratio(med(mm, "bf16-bf16", "pp"), med(lc, "bf16", "pp")),
        "pp_int8_vs_q8_0": ratio(med(mm, "int8-int8", "pp"), med(lc, "q8_0", "pp")),
        "tg_int8_vs_q8_0": ratio(med(mm, "int8-f32", "tg"), med(lc, "q8_0", "tg")),
        "tg_bf16_vs_llamacpp_bf16": ratio(med(mm, "bf16-bf16", "tg"), med(lc, "bf16", "tg")),
        "batch32_vs_llamacpp_best": ratio(best(mm, MM_MODES, "b32"), best(lc, LC_TYPES, "b32")),
        "int4_tg_vs_q4_0": ratio(med(mm, "int4_g32-int8", "tg"), med(lc, "q4_0", "tg")),
        "int4_tg_vs_q4_k": ratio(med(mm, "int4_g32_zp-int8", "tg"), med(lc, "q4_k", "tg")),
        "int4_batch32_vs_q4_0": ratio(med(mm, "int4_g32-int8", "b32"), med(lc, "q4_0", "b32")),
        "int4_batch32_vs_q4_k": ratio(med(mm, "int4_g32_zp-int8", "b32"),
                                      med(lc, "q4_k", "b32")),
    }
    for mode in MM_MODES:
        for metric in ("pp", "tg", "b32"):
            out[f"mm_{mode.replace('-', '_')}_{metric}_tok_s"] = round(med(mm, mode, metric), 2)
    for t in LC_TYPES:
        for metric in ("pp", "tg", "b1", "b8", "b32"):
            out[f"llamacpp_{t}_{metric}_tok_s"] = round(med(lc, t, metric), 2)
    print(json.dumps(out, separators=(",", ":")).replace("NaN", "null"))


if __name__ == "__main__":
    main()
