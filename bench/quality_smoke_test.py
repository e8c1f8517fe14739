#!/usr/bin/python3
"""bench:quality on the bundled demo model, a few chunks, cheaply.

Checks what bench/peer/llamacpp_side_by_side.sh relies on to compare with
llama-perplexity on the same tokens: --score_from scores only each chunk's
later positions (the count in the JSON line), --tokens_out writes the ids
scored, and --bf16_model_dir adds the bf16 modes, measured on the
checkpoint rounded to bf16 (written here with the standard library): small
but nonzero KL divergence from the fp32 reference. A --score_from outside
the chunk is refused, naming the flag.
"""
import array
import json
import math
import os
import shutil
import struct
import subprocess
import sys

DEMO = "models/shapes-demo"
TOKENS, CHUNK = 96, 32


def write_bf16_twin(out_dir):
    """The demo checkpoint with every 2-D fp32 tensor rounded to bf16."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(DEMO, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    new_header, blobs, offset = {}, [], 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        raw = data[t["data_offsets"][0]:t["data_offsets"][1]]
        dtype = t["dtype"]
        if dtype == "F32" and len(t["shape"]) == 2:
            bits = array.array("I", raw)
            raw = array.array("H", ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 & 0xFFFF
                                    for u in bits)).tobytes()
            dtype = "BF16"
        new_header[name] = {"dtype": dtype, "shape": t["shape"],
                            "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(new_header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(out_dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(os.path.join(DEMO, name), out_dir)


def run(*flags):
    cmd = ["bench/quality", f"--model_dir={DEMO}", f"--tokens={TOKENS}", f"--chunk={CHUNK}",
           "--threads=1", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1200)


def main():
    tmp = os.environ.get("TEST_TMPDIR", "/tmp")
    errors = []

    def check(cond, what):
        if not cond:
            errors.append(what)

    twin = os.path.join(tmp, "demo-bf16")
    write_bf16_twin(twin)
    tokens_out = os.path.join(tmp, "tokens.txt")
    r = run("--score_from=16", f"--tokens_out={tokens_out}", f"--bf16_model_dir={twin}")
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr[-4000:])
    if r.returncode != 0:
        print("bench:quality exited with", r.returncode)
        return 1
    j = json.loads(r.stdout.strip().splitlines()[-1])
    chunks = TOKENS // CHUNK
    check(j["tokens"] == TOKENS and j["score_from"] == 16, j)
    check(j["positions"] == chunks * (CHUNK - 1 - 16), ("positions", j["positions"]))
    modes = {m["mode"]: m for m in j["modes"]}
    for name in ("bf16 weights, f32 act", "bf16 weights, bf16 act", "int8 weights, int16 act",
                 "int8_g32 weights, int8 act", "int4_g32_zp weights, int8 act"):
        check(name in modes, ("missing mode", name))
    for name, m in modes.items():
        check(math.isfinite(m["kld"]) and m["kld"] >= 0, (name, m))
        check(0 <= m["top1"] <= 1 and m["ppl"] > 0, (name, m))
    bf16 = modes.get("bf16 weights, f32 act", {})
    # Rounded weights: not the reference itself, and close to it.
    check(0 < bf16.get("kld", 0) < 1e-2, ("bf16 kld", bf16))
    with open(tokens_out) as f:
        ids = [int(line) for line in f]
    check(len(ids) == TOKENS and all(0 <= i < 1038 for i in ids), ("tokens_out", ids[:8]))

    # Every position scored: more positions, the same tokens; no bf16 modes
    # without the twin (an fp32 checkpoint has no bf16 weights).
    tokens_all = os.path.join(tmp, "tokens_all.txt")
    r = run("--score_from=0", f"--tokens_out={tokens_all}")
    check(r.returncode == 0, ("score_from=0", r.returncode, r.stderr[-2000:]))
    if r.returncode == 0:
        j = json.loads(r.stdout.strip().splitlines()[-1])
        check(j["positions"] == chunks * (CHUNK - 1), ("positions", j["positions"]))
        check(all("bf16 weights" not in m["mode"] for m in j["modes"]), j["modes"])
        with open(tokens_all) as f:
            check([int(line) for line in f] == ids, "tokens differ between runs")

    r = run(f"--score_from={CHUNK - 1}")
    check(r.returncode != 0 and "--score_from" in r.stderr, ("bad score_from", r.stderr[-2000:]))

    for e in errors:
        print("FAILED:", e)
    print("quality_smoke_test:", "FAILED" if errors else "passed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
