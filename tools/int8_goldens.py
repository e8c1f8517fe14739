#!/usr/bin/env python3
"""Generates model/testdata/int8_goldens/: transformers on int8-dequantized weights.

mmserve's --quantize=int8 (and int8_g32) quantizes every language-model
projection and lm_head at load (model/cpu/linear.h, Int8Weights). This script
applies exactly the same scheme to the committed tiny checkpoints in
model/testdata/models/ and runs transformers 4.57.6 in fp32 on the
dequantized weights, so the C++ int8 runtime can be compared to a reference
that has the same weights:

  for each row of a matrix and each group of `group` consecutive columns
  (the whole row for "int8"): s = max|w| / 127 in fp32,
  q = round-half-even(w / s) clamped to [-127, 127] (0 when s = 0),
  dequantized w' = q * s in fp32.

The vision tower and an untied embedding are left as stored (mmserve does
not quantize them). Writes, per model and scheme, <scheme>.safetensors
(logits_last.<prompt> [V] f32 on the quantized model) and <scheme>.json
(input ids, greedy ids, top-2 margins, and for information the largest
logit change that quantization itself causes against the unquantized model).

Usage (venv as in tools/README.md; reads model/testdata/models/):
  python tools/int8_goldens.py [--out model/testdata/int8_goldens]
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

MODELS = ["qwen2vl-tiny-mqa-bf16", "qwen2vl-tiny-gqa2-untied-sharded"]
SCHEMES = {"int8": 0, "int8_g32": 32}
PROMPTS = ["short", "ascii", "long"]
NEW_TOKENS = 32
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def dequantize_int8(w, group):
    """w [n, k] float32 -> q * s with mmserve's Int8Weights scheme."""
    n, k = w.shape
    g = k if group == 0 or group >= k else group
    groups = (k + g - 1) // g
    wp = torch.nn.functional.pad(w, (0, groups * g - k)).view(n, groups, g)  # zeros: amax same
    s = wp.abs().amax(dim=2, keepdim=True) / 127
    safe = torch.where(s > 0, s, torch.ones_like(s))
    q = torch.where(s > 0, torch.round(wp / safe), torch.zeros_like(wp)).clamp(-127, 127)
    return (q * s).view(n, groups * g)[:, :k].contiguous()


def quantize_model(model, group):
    lm = model.model.language_model
    with torch.no_grad():
        for layer in lm.layers:
            for name in PROJECTIONS:
                mod = layer.get_submodule(name)
                mod.weight.copy_(dequantize_int8(mod.weight.float(), group))
        # A tied lm_head is the embedding table: both change, as in mmserve.
        model.lm_head.weight.copy_(dequantize_int8(model.lm_head.weight.float(), group))


def main():
    out, models_dir = start_script(__doc__, "int8_goldens")
    prompts = dict(golden_corpus.lm_prompts())
    for name in MODELS:
        path = os.path.join(models_dir, name)
        tok = Qwen2TokenizerFast.from_pretrained(path)
        base = load_model(path, torch.float32)
        base_logits = {}
        for p in PROMPTS:
            enc = tok(prompts[p], return_tensors="pt")
            with torch.no_grad():
                base_logits[p] = base(**enc).logits[0, -1].float()
        del base
        for scheme, group in SCHEMES.items():
            model = load_model(path, torch.float32)
            quantize_model(model, group)
            tensors, entries = {}, []
            for p in PROMPTS:
                enc = tok(prompts[p], return_tensors="pt")
                with torch.no_grad():
                    logits = model(**enc).logits[0, -1].float()
                tensors[f"logits_last.{p}"] = logits
                shift = float((logits - base_logits[p]).abs().max())
                entries.append(greedy_entry(model, tok, p, enc, NEW_TOKENS,
                                            {"quantization_logit_shift": shift}))
                print(f"  {name} {scheme} {p}: min margin "
                      f"{min(entries[-1]['greedy_top2_margin']):.4f}, "
                      f"max |int8 - fp32 logits| {shift:.4f}")
            out_dir = os.path.join(out, name)
            write_safetensors(os.path.join(out_dir, f"{scheme}.safetensors"), tensors,
                              {"model": name, "scheme": scheme})
            write_json(os.path.join(out_dir, f"{scheme}.json"), {
                "about": ("transformers fp32 (eager attention, batch 1) on the checkpoint with "
                          "every language-model projection and lm_head replaced by its int8 "
                          "dequantization (tools/int8_goldens.py, group %d; 0 = one scale per "
                          "output row). greedy: %d tokens, eos masked, as lm_golden.json. "
                          "quantization_logit_shift: max |logits(int8) - logits(original)| "
                          "at the last prompt position." % (group, NEW_TOKENS)),
                "eos_ids_masked": greedy_config(tok)["eos_token_id"],
                "group": group,
                "model": name,
                "prompts": entries,
                "scheme": scheme,
                "versions": versions(),
            })
            del model


if __name__ == "__main__":
    main()
