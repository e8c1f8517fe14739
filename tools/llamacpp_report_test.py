#!/usr/bin/python3
"""tools/llamacpp_report.py on raw outputs written here: its pairings.

The outputs are in the formats the bench/peer script saves (lm_bench's JSON
line, llama-bench -o json, llama-batched-bench jsonl, bench:quality's JSON
line, llama-perplexity's and llama-quantize's logs), with figures chosen so
that each rule of the servable pairing decides the answer: the fastest mode
is too inaccurate, the fastest llama.cpp format is too accurate.
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = os.path.join(HERE, "llamacpp_report.py")

# tag -> (pp, tg, b32, kld); int8-int8 is the fastest but above Q8_0's KL.
MM = {
    "bf16-f32": (500, 40, 250, 1e-6),
    "bf16-bf16": (700, 38, 300, 2e-4),
    "int8-f32": (540, 80, 310, 9e-4),
    "int8-int8": (1300, 90, 550, 5e-3),
    "int8_g32-int8": (1100, 70, 500, 8e-4),
    "int4_g32-int8": (900, 120, 480, 2e-2),
    "int4_g32_zp-int8": (880, 110, 470, 9e-3),
}
QUALITY_NAMES = {
    "bf16-f32": "bf16 weights, f32 act",
    "bf16-bf16": "bf16 weights, bf16 act",
    "int8-f32": "int8 weights, int16 act",
    "int8-int8": "int8 weights, int8 act",
    "int8_g32-int8": "int8_g32 weights, int8 act",
    "int4_g32-int8": "int4_g32 weights, int8 act",
    "int4_g32_zp-int8": "int4_g32_zp weights, int8 act",
}
# type -> (pp, tg, b32, kld, same top p %); bf16 is the fastest at prefill but
# more accurate than Q8_0, so it is not a peer of the servable modes.
LC = {
    "bf16": (1000, 35, 300, 5e-5, 99.9),
    "f16": (600, 36, 280, 4e-5, 99.9),
    "q8_0": (400, 60, 200, 1e-3, 99.5),
    "q4_0": (420, 95, 260, 3e-2, 95.0),
    "q4_k": (380, 100, 240, 1e-2, 97.0),
}


def perplexity_log(kld, top):
    return (f"====== Perplexity statistics ======\n"
            f"Mean PPL(Q)                   :  12.345678 ±   0.100000\n"
            f"Mean PPL(base)                :  12.300000 ±   0.100000\n"
            f"====== KL divergence statistics ======\n"
            f"Mean    KLD: {kld:10.6f} ±   0.000100\n"
            f"Maximum KLD:   0.500000\n"
            f"====== Token probability statistics ======\n"
            f"Same top p: {top:6.3f} ± 0.100 %\n")


def write_outputs(d):
    for tag, (pp, tg, b32, _) in MM.items():
        with open(os.path.join(d, f"r1.lm.{tag}.json"), "w") as f:
            f.write(json.dumps({"pp512_tok_s": pp, "tg128_tok_s": tg, "batch32_tok_s": b32,
                                "isa": "avx512"}) + "\n")
    modes = [{"mode": QUALITY_NAMES[t], "kld": v[3], "top1": 0.99, "ppl": 12.4}
             for t, v in MM.items()]
    with open(os.path.join(d, "quality.json"), "w") as f:
        f.write(json.dumps({"bench": "quality", "positions": 508, "reference_perplexity": 12.3,
                            "modes": modes}) + "\n")
    for t, (pp, tg, b32, kld, top) in LC.items():
        with open(os.path.join(d, f"r1.llama-bench.{t}.json"), "w") as f:
            json.dump([{"n_prompt": 512, "n_gen": 0, "avg_ts": pp},
                       {"n_prompt": 0, "n_gen": 128, "avg_ts": tg}], f)
        with open(os.path.join(d, f"r1.batched.{t}.jsonl"), "w") as f:
            for pl, speed in ((1, tg), (8, b32 / 2), (32, b32)):
                f.write(json.dumps({"pl": pl, "speed_tg": speed}) + "\n")
        with open(os.path.join(d, f"quality.{t}.log"), "w") as f:
            f.write(perplexity_log(kld, top))
    with open(os.path.join(d, "quality.q4_k.quantize.log"), "w") as f:
        f.write("warning: blk.0.attn_q.weight - ncols 128 not divisible by 256 (required for "
                "type    q4_K) -> falling back to    q5_0\n"
                "llama_model_quantize_impl: WARNING: 22 of 40 tensor(s) required fallback "
                "quantization\n")


def main():
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as d:
        write_outputs(d)
        out = subprocess.run([sys.executable, REPORT, f"--dir={d}", "--quality_model=demo"],
                             check=True, capture_output=True, text=True).stdout
        j = json.loads(out.strip().splitlines()[-1])
        # Modes at most Q8_0's KL (1e-3): bf16-f32, bf16-bf16, int8-f32, int8_g32-int8;
        # llama.cpp at least Q8_0's: q8_0, q4_0, q4_k.
        check(j["pp_vs_llamacpp_servable_mode"] == "int8_g32-int8", j)
        check(j["pp_vs_llamacpp_servable_llamacpp"] == "q4_0", j)
        check(abs(j["pp_vs_llamacpp_servable"] - round(1100 / 420, 3)) < 1e-9, j)
        check(j["tg_vs_llamacpp_servable_mode"] == "int8-f32", j)
        check(j["tg_vs_llamacpp_servable_llamacpp"] == "q4_k", j)
        check(abs(j["tg_vs_llamacpp_servable"] - round(80 / 100, 3)) < 1e-9, j)
        check(j["b32_vs_llamacpp_servable_mode"] == "int8_g32-int8", j)
        check(j["b32_vs_llamacpp_servable_llamacpp"] == "q4_0", j)
        # int4 at most Q4_K's KL (1e-2): int4_g32_zp only (int4_g32's 2e-2 is worse).
        check(j["int4_tg_vs_q4_k_mode"] == "int4_g32_zp-int8", j)
        check(abs(j["int4_tg_vs_q4_k"] - round(110 / 100, 3)) < 1e-9, j)
        check(j["llamacpp_q8_0_kld"] == 1e-3 and abs(j["llamacpp_q8_0_top1"] - 0.995) < 1e-9, j)
        check(j["llamacpp_reference_ppl"] == 12.3 and j["mm_reference_ppl"] == 12.3, j)
        check(j["llamacpp_q4_k_fallback_tensors"] == 22, j)
        check(j["llamacpp_q4_k_fallback_types"] == ["q5_0"], j)
        check(j["mm_int8_int8_kld"] == 5e-3 and j["quality_positions"] == 508, j)
        check("KL" in out and "fell back to q5_0" in out, out)

        # Without llama-perplexity's figures the servable ratios are null, not guessed.
        for t in LC:
            os.remove(os.path.join(d, f"quality.{t}.log"))
        out = subprocess.run([sys.executable, REPORT, f"--dir={d}"], check=True,
                             capture_output=True, text=True).stdout
        j = json.loads(out.strip().splitlines()[-1])
        for key in ("pp_vs_llamacpp_servable", "tg_vs_llamacpp_servable",
                    "b32_vs_llamacpp_servable", "int4_tg_vs_q4_k"):
            check(j[key] is None, (key, j[key]))
        check(j["pp_vs_llamacpp_best"] == round(1300 / 1000, 3), j)
    for f in failures:
        print("FAILED:", f)
    print("llamacpp_report_test:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
