#!/usr/bin/env python3
"""The table and JSON line of bench/peer/llamacpp_side_by_side.sh.

Reads the raw outputs of its rounds from --dir:
  r<i>.lm.<dtype>-<activations>.json   lm_bench's last JSON line
  r<i>.llama-bench.<type>.json         llama-bench -o json (pp512, tg128)
  r<i>.batched.<type>.jsonl            llama-batched-bench --output-format jsonl
  quality.json                         bench:quality's last JSON line
  quality.<type>.log                   llama-perplexity --kl-divergence
  quality.q4_k.quantize.log            llama-quantize (its fallbacks)
and prints the medians over rounds as a table, then one JSON line last with
the ratios (mmserve / llama.cpp, same machine, same run). Speed is at real
dims on random weights; KL divergence (from each side's fp32 reference, on
the same tokens and positions) on the quality model:
  pp_vs_llamacpp_servable    prefill 512: the fastest servable mmserve mode
                             whose KL divergence is at most Q8_0's, over
                             llama.cpp's fastest format whose KL divergence
                             is at least Q8_0's (equal or worse)
  tg_vs_llamacpp_servable    the same for decode of 1 sequence (tg128)
  b32_vs_llamacpp_servable   the same for decode of 32 sequences
  int4_tg_vs_q4_k            tg128: the fastest servable int4 mode whose KL
                             divergence is at most Q4_K's, over Q4_K
(each with *_mode and *_llamacpp naming the pair). A servable mode is a
--quantize / --activation_dtype pair the language service accepts
(model::ParseQuantize and ParseActivationDtype): bf16 activations only
without --quantize, int8 activations only with it. Then the former ratios:
  pp_vs_llamacpp_best        best pp512 of any mode / llama.cpp's best type
  pp_bf16_vs_llamacpp_bf16   bf16 weights with bf16 activations / bf16
  pp_int8_vs_q8_0            int8 weights with int8 activations / Q8_0
  tg_int8_vs_q8_0            tg128, int8 (int16 activations: the serving
                             default) / Q8_0
  tg_bf16_vs_llamacpp_bf16   tg128, bf16 weights, bf16 activations / bf16
  batch32_vs_llamacpp_best   decode of 32 sequences, best of each side
  int4_tg_vs_q4_0            tg128, int4_g32 / Q4_0 (both symmetric, a scale
                             per 32 weights)
  int4_g32_zp_tg_vs_q4_k     tg128, int4_g32_zp / Q4_K (both a scale and an
                             offset per 32 weights; Q4_K only where rows
                             are a multiple of 256 wide, see the script)
  int4_batch32_vs_q4_0       the same pairs, decode of 32 sequences
  int4_batch32_vs_q4_k
Every input figure is in the JSON line too: mm_<mode>_<pp|tg|b32>_tok_s,
mm_<mode>_<kld|top1|ppl>, llamacpp_<type>_<pp|tg|b1|b8|b32>_tok_s and
llamacpp_<type>_<kld|top1|ppl>, both sides' reference perplexity (the same
fp32 model: they should agree closely) and what Q4_K fell back to.
The table shows every mode, so the other pairings can be read from it.
"""

import argparse
import glob
import math
import json
import os
import re
import statistics

MM_MODES = {  # file tag -> label
    "bf16-f32": "bf16 weights, f32 act",
    "bf16-bf16": "bf16 weights, bf16 act",
    "int8-f32": "int8 weights, int16 act",
    "int8-int8": "int8 weights, int8 act",
    "int8_g32-f32": "int8 g32 weights, int16 act",
    "int8_g32-int8": "int8 g32 weights, int8 act",
    "int4_g32-int8": "int4 g32 weights, int8 act",
    "int4_g128-int8": "int4 g128 weights, int8 act",
    "int4_g32_zp-int8": "int4 g32 zp weights, int8 act",
    "int4_g128_zp-int8": "int4 g128 zp weights, int8 act",
}
LC_TYPES = ["bf16", "f16", "q8_0", "q4_0", "q4_k"]
# lm_bench file tag -> bench:quality's mode name.
QUALITY_NAMES = {
    "bf16-f32": "bf16 weights, f32 act",
    "bf16-bf16": "bf16 weights, bf16 act",
    "int8-f32": "int8 weights, int16 act",
    "int8-int8": "int8 weights, int8 act",
    "int8_g32-f32": "int8_g32 weights, int16 act",
    "int8_g32-int8": "int8_g32 weights, int8 act",
    "int4_g32-int8": "int4_g32 weights, int8 act",
    "int4_g128-int8": "int4_g128 weights, int8 act",
    "int4_g32_zp-int8": "int4_g32_zp weights, int8 act",
    "int4_g128_zp-int8": "int4_g128_zp weights, int8 act",
}
QUANTIZE = {"none", "int8", "int8_g32", "int4_g32", "int4_g128", "int4_g32_zp", "int4_g128_zp"}


def servable(tag):
    """Whether the language service accepts lm_bench mode `tag` as flags."""
    weights, act = tag.split("-")
    quantize = "none" if weights in ("bf16", "f32") else weights
    if quantize not in QUANTIZE:
        return False
    if act == "bf16":
        return quantize == "none"
    if act == "int8":
        return quantize != "none"
    return act == "f32"


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


def read_quality(d):
    """({tag: mmserve KL}, {type: llama.cpp figures}, bench:quality's JSON)."""
    mm, lc, q = {}, {}, {}
    path = os.path.join(d, "quality.json")
    if os.path.exists(path):
        with open(path) as f:
            text = f.read().strip()
        q = json.loads(text) if text.startswith("{") else {}
        by_name = {m["mode"]: m for m in q.get("modes", [])}
        for tag, name in QUALITY_NAMES.items():
            if name in by_name:
                mm[tag] = by_name[name]
    patterns = {"kld": r"Mean\s+KLD:\s*([-\d.eE+]+)", "top1": r"Same top p:\s*([\d.]+)",
                "ppl": r"Mean PPL\(Q\)\s*:\s*([\d.]+)",
                "ppl_base": r"Mean PPL\(base\)\s*:\s*([\d.]+)"}
    for t in LC_TYPES:
        path = os.path.join(d, f"quality.{t}.log")
        if not os.path.exists(path):
            continue
        with open(path, errors="replace") as f:
            text = f.read()
        fig = {}
        for key, pat in patterns.items():
            m = re.search(pat, text)
            if m:
                fig[key] = float(m.group(1))
        if "top1" in fig:
            fig["top1"] /= 100
        lc[t] = fig
    path = os.path.join(d, "quality.q4_k.quantize.log")
    if os.path.exists(path) and "q4_k" in lc:
        with open(path, errors="replace") as f:
            text = f.read()
        m = re.search(r"(\d+) of (\d+) tensor\(s\) required fallback", text)
        lc["q4_k"]["fallback_tensors"] = int(m.group(1)) if m else 0
        lc["q4_k"]["fallback_types"] = sorted(set(re.findall(r"falling back to\s+(\w+)", text)))
    return mm, lc, q


def servable_ratios(mm, lc, mm_kl, lc_kl):
    """The four *_servable / int4 keys (with the pair each one compares)."""
    out = {}

    def med(side, key, metric):
        return median(side.get(key, {}).get(metric, []))

    def fastest(side, keys, metric):
        pairs = [(med(side, k, metric), k) for k in keys if side.get(k, {}).get(metric)]
        return max(pairs) if pairs else (float("nan"), None)

    q8 = lc_kl.get("q8_0", {}).get("kld")
    q4k = lc_kl.get("q4_k", {}).get("kld")
    for name, metric in (("pp", "pp"), ("tg", "tg"), ("b32", "b32")):
        key = f"{name}_vs_llamacpp_servable"
        out[key] = out[key + "_mode"] = out[key + "_llamacpp"] = None
        if q8 is None:
            continue
        mine = [t for t in mm if servable(t) and t in mm_kl and mm_kl[t]["kld"] <= q8]
        theirs = [t for t in LC_TYPES if lc_kl.get(t, {}).get("kld") is not None and
                  lc_kl[t]["kld"] >= q8]
        a, a_mode = fastest(mm, mine, metric)
        b, b_type = fastest(lc, theirs, metric)
        if a_mode and b_type:
            out[key], out[key + "_mode"], out[key + "_llamacpp"] = round(a / b, 3), a_mode, b_type
    out["int4_tg_vs_q4_k"] = out["int4_tg_vs_q4_k_mode"] = None
    if q4k is not None and lc.get("q4_k", {}).get("tg"):
        int4 = [t for t in mm if t.startswith("int4") and servable(t) and t in mm_kl and
                mm_kl[t]["kld"] <= q4k]
        a, a_mode = fastest(mm, int4, "tg")
        if a_mode:
            out["int4_tg_vs_q4_k"] = round(a / med(lc, "q4_k", "tg"), 3)
            out["int4_tg_vs_q4_k_mode"] = a_mode
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llamacpp", default="llama.cpp")
    p.add_argument("--dims", default="qwen2-0.5b")
    p.add_argument("--quality_model", default="", help="the model KL divergence was measured on")
    args = p.parse_args()
    mm, lc = read_mm(args.dir), read_lc(args.dir)
    mm_kl, lc_kl, quality = read_quality(args.dir)

    def med(side, key, metric):
        return median(side.get(key, {}).get(metric, []))

    rounds = max([len(v["pp"]) for v in mm.values()] + [0])
    print(f"mmserve lm_bench vs {args.llamacpp}, {args.dims} dims, random weights, "
          f"{args.threads} threads, medians of {rounds} interleaved rounds (tok/s)")
    print(f"  KL divergence and top-1 agreement: {args.quality_model or '?'}, "
          f"{quality.get('positions', '?')} positions (the same tokens on both sides)")
    print(f"  {'side':<48}{'pp512':>10}{'tg128':>10}{'batch 8':>10}{'batch 32':>10}"
          f"{'KL':>12}{'top-1':>8}")

    def kl_cols(fig):
        kld, top1 = fig.get("kld"), fig.get("top1")
        return (f"{kld:>12.3g}" if kld is not None else f"{'':>12}") + \
            (f"{100 * top1:>7.2f}%" if top1 is not None else f"{'':>8}")

    for mode, label in MM_MODES.items():
        if mode in mm:
            flag = "" if servable(mode) else " *"
            print(f"  {'mmserve ' + label + ' (' + mm[mode]['isa'] + ')' + flag:<48}"
                  f"{med(mm, mode, 'pp'):>10.1f}{med(mm, mode, 'tg'):>10.2f}{'':>10}"
                  f"{med(mm, mode, 'b32'):>10.1f}{kl_cols(mm_kl.get(mode, {}))}")
    for t in LC_TYPES:
        print(f"  {'llama.cpp ' + t:<48}{med(lc, t, 'pp'):>10.1f}{med(lc, t, 'tg'):>10.2f}"
              f"{med(lc, t, 'b8'):>10.1f}{med(lc, t, 'b32'):>10.1f}{kl_cols(lc_kl.get(t, {}))}")
    if lc_kl.get("q4_k", {}).get("fallback_tensors"):
        print(f"  (quality model's Q4_K: {lc_kl['q4_k']['fallback_tensors']} tensors fell back "
              f"to {', '.join(lc_kl['q4_k']['fallback_types'])}: rows not a multiple of 256)")

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
        "int4_g32_zp_tg_vs_q4_k": ratio(med(mm, "int4_g32_zp-int8", "tg"),
                                        med(lc, "q4_k", "tg")),
        "int4_batch32_vs_q4_0": ratio(med(mm, "int4_g32-int8", "b32"), med(lc, "q4_0", "b32")),
        "int4_batch32_vs_q4_k": ratio(med(mm, "int4_g32_zp-int8", "b32"),
                                      med(lc, "q4_k", "b32")),
    }
    out.update(servable_ratios(mm, lc, mm_kl, lc_kl))
    out["quality_model"] = args.quality_model or None
    out["quality_positions"] = quality.get("positions")
    out["mm_reference_ppl"] = quality.get("reference_perplexity")
    out["llamacpp_reference_ppl"] = lc_kl.get("q8_0", {}).get("ppl_base")
    out["llamacpp_q4_k_fallback_tensors"] = lc_kl.get("q4_k", {}).get("fallback_tensors")
    out["llamacpp_q4_k_fallback_types"] = lc_kl.get("q4_k", {}).get("fallback_types")
    for mode in MM_MODES:
        tag = mode.replace("-", "_")
        for metric in ("pp", "tg", "b32"):
            out[f"mm_{tag}_{metric}_tok_s"] = round(med(mm, mode, metric), 2)
        for metric in ("kld", "top1", "ppl"):
            out[f"mm_{tag}_{metric}"] = mm_kl.get(mode, {}).get(metric)
    for t in LC_TYPES:
        for metric in ("pp", "tg", "b1", "b8", "b32"):
            out[f"llamacpp_{t}_{metric}_tok_s"] = round(med(lc, t, metric), 2)
        for metric in ("kld", "top1", "ppl"):
            out[f"llamacpp_{t}_{metric}"] = lc_kl.get(t, {}).get(metric)
    out = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}
    print(json.dumps(out, separators=(",", ":")))


if __name__ == "__main__":
    main()
