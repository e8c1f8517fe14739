#!/usr/bin/env python3
"""Generates model/testdata/bf16_goldens/: transformers in bfloat16.

mmserve's bf16-activation mode (LinearKernel::kBf16Dot, model/cpu/linear.h)
rounds the input of every bf16 linear layer to bf16 and accumulates in fp32;
the rest of the model (residual stream, norms, attention, logits) stays fp32.
transformers in bfloat16 rounds everything to bf16. This script runs the
committed bf16 checkpoints both ways (bfloat16 and float32, eager attention,
batch 1, one thread) and writes, per model, bf16.safetensors
(logits_last.<prompt> [V] from bfloat16 widened to f32, and
logits_fp32.<prompt> from float32) and bf16.json (input ids, greedy ids and
top-2 margins of the bfloat16 model, and bf16_logit_shift: max |bf16 - fp32
logits| at the last prompt position, the scale of bf16 rounding's effect
that the C++ test's bounds are set from).

Usage (venv as in tools/README.md; reads model/testdata/models/):
  python tools/bf16_goldens.py [--out model/testdata/bf16_goldens]
"""

import os
import sys

import torch
import transformers
from transformers import Qwen2TokenizerFast

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_corpus  # noqa: E402
from golden_util import (greedy_config, greedy_entry, load_model, start_script,  # noqa: E402
                         versions, write_json, write_safetensors)

MODELS = ["qwen2vl-tiny-mqa-bf16"]
PROMPTS = ["short", "ascii", "long"]
NEW_TOKENS = 32


def main():
    out, models_dir = start_script(__doc__, "bf16_goldens")
    prompts = dict(golden_corpus.lm_prompts())
    for name in MODELS:
        path = os.path.join(models_dir, name)
        tok = Qwen2TokenizerFast.from_pretrained(path)
        fp32 = load_model(path, torch.float32)
        bf16 = load_model(path, torch.bfloat16)
        tensors, entries = {}, []
        for p in PROMPTS:
            enc = tok(prompts[p], return_tensors="pt")
            with torch.no_grad():
                want32 = fp32(**enc).logits[0, -1].float()
                logits = bf16(**enc).logits[0, -1].float()
            tensors[f"logits_last.{p}"] = logits
            tensors[f"logits_fp32.{p}"] = want32
            shift = float((logits - want32).abs().max())
            entries.append(greedy_entry(bf16, tok, p, enc, NEW_TOKENS, {"bf16_logit_shift": shift}))
            print(f"  {name} {p}: min margin {min(entries[-1]['greedy_top2_margin']):.4f}, "
                  f"max |bf16 - fp32 logits| {shift:.4f}")
        out_dir = os.path.join(out, name)
        write_safetensors(os.path.join(out_dir, "bf16.safetensors"), tensors,
                          {"model": name, "dtype": "bfloat16"})
        write_json(os.path.join(out_dir, "bf16.json"), {
            "about": ("transformers bfloat16 (eager attention, batch 1, one thread) on the "
                      "checkpoint (tools/bf16_goldens.py). logits_last: the bfloat16 model's "
                      "logits at the last prompt position; logits_fp32: the float32 model's. "
                      "greedy: %d tokens of the bfloat16 model, eos masked, as "
                      "lm_golden.json. bf16_logit_shift: max |logits_last - logits_fp32|."
                      % NEW_TOKENS),
            "eos_ids_masked": greedy_config(tok)["eos_token_id"],
            "model": name,
            "prompts": entries,
            "versions": versions(),
        })


if __name__ == "__main__":
    main()
