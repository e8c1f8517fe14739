"""Helpers shared by gen_goldens.py and vision_goldens.py."""

import argparse
import hashlib
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

import tokenizers
import transformers
from transformers import GenerationConfig, Qwen2VLForConditionalGeneration

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
    "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
]


def start_script(doc, out_subdir):
    """Parses --out (default model/testdata/<out_subdir>), makes torch
    deterministic on one thread, quiets transformers. Returns (out, models_dir)."""
    here = os.path.dirname(os.path.abspath(__file__))
    testdata = os.path.join(here, "..", "model", "testdata")
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(testdata, out_subdir))
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    return args.out, os.path.join(testdata, "models")


def greedy_entry(model, tok, name, enc, n, extra):
    """A prompt's golden entry: its ids, n greedy tokens of model with their
    chosen logits and top-2 margins, and the fields in extra."""
    new, chosen, margins = generate_greedy(model, tok, enc, n)
    entry = {
        "name": name,
        "input_ids": enc["input_ids"][0].tolist(),
        "greedy_ids": new,
        "greedy_top2_margin": margins,
        "greedy_chosen_logit": chosen,
    }
    entry.update(extra)
    return entry


def write_json(path, obj):
    """Writes JSON with sorted keys, real UTF-8 and a trailing newline."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1, sort_keys=True)
        f.write("\n")


def write_safetensors(path, tensors, meta):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tensors = {k: v.detach().contiguous().clone() for k, v in tensors.items()}
    # One metadata key: safetensors writes the metadata map in hash order, so
    # several keys would make the header bytes differ from run to run.
    about = "; ".join(f"{k}={meta[k]}" for k in sorted(meta))
    save_file(tensors, path, metadata={"about": about})


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def versions():
    return {
        "numpy": np.__version__,
        "pillow": __import__("PIL").__version__,
        "python": sys.version.split()[0],
        "safetensors": __import__("safetensors").__version__,
        "tokenizers": tokenizers.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def special_ids(tok):
    """Special token -> id in tok."""
    return {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}


def load_model(path, dtype):
    model = Qwen2VLForConditionalGeneration.from_pretrained(
        path, dtype=dtype, attn_implementation="eager")
    model.eval()
    return model


def greedy_config(tok):
    ids = special_ids(tok)
    # Plain greedy. min_new_tokens masks every eos id to -inf until all tokens are
    # produced, so exactly max_new_tokens come out; no repetition penalty.
    return dict(do_sample=False, num_beams=1, repetition_penalty=1.0, temperature=None,
                top_k=None, top_p=None, eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
                pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["<|endoftext|>"])


def generate_greedy(model, tok, inputs, n):
    gc = GenerationConfig(max_new_tokens=n, min_new_tokens=n, **greedy_config(tok))
    # Replace the model's generation config outright: generate(generation_config=gc)
    # would fill every field gc leaves at its default from generation_config.json
    # (do_sample=True, repetition_penalty=1.05 for Qwen2-VL-Instruct).
    saved, model.generation_config = model.generation_config, gc
    with torch.no_grad():
        out = model.generate(**inputs, output_logits=True, return_dict_in_generate=True)
    model.generation_config = saved
    prompt_len = inputs["input_ids"].shape[1]
    new = out.sequences[0, prompt_len:].tolist()
    assert len(new) == n, len(new)
    chosen, margins = [], []
    for step, logits in enumerate(out.logits):  # raw logits, before eos masking
        l = logits[0].float()
        # The eos ids are masked during generation; margin over the unmasked ones.
        # (bf16 logits tie often; torch.argmax then takes the first index.)
        mask = torch.zeros_like(l, dtype=torch.bool)
        mask[gc.eos_token_id] = True
        lm = l.masked_fill(mask, float("-inf"))
        best = lm[new[step]]
        assert best == lm.max(), (step, new[step])
        mask[new[step]] = True
        chosen.append(float(best))
        margins.append(float(best - l.masked_fill(mask, float("-inf")).max()))
    return new, chosen, margins
