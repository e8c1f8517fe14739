#!/usr/bin/env python3
"""Tiny random Qwen3, Qwen3-MoE and Qwen2.5 text checkpoints and their transformers goldens.

Writes model/testdata/models/<name>/ (config.json, model.safetensors, the tiny
tokenizer of model/testdata/tokenizer) and model/testdata/goldens/<name>/
lm_golden.{json,safetensors} in the layout of gen_goldens.py's text goldens
(fp32 prompts: input ids, last-row logits, 32 greedy tokens with eos masked),
computed by Qwen3ForCausalLM (Qwen3MoeForCausalLM, Qwen2ForCausalLM) with
eager attention. The models exercise what Qwen3 adds to Qwen2's decoder:
head_dim given in config.json (and not hidden_size / num_attention_heads), no
q/k/v biases (or biases with attention_bias), and an RMSNorm over each head
of q and k before RoPE; the MoE ones add routed experts (top-k of a softmax,
renormalized or not, dense layers among sparse ones). The Qwen2.5 one
(model_type qwen2, as Qwen2.5's text checkpoints) is Qwen2's decoder with
plain RoPE: q/k/v biases, no q/k norm, GQA.

  python3 tools/gen_qwen3_goldens.py [name ...]   # versions: tools/requirements.txt
"""
import os
import shutil
import sys

import torch
import transformers
from transformers import (Qwen2Config, Qwen2ForCausalLM, Qwen2TokenizerFast, Qwen3Config,
                          Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_corpus  # noqa: E402
from gen_goldens import LM_NEW_TOKENS, SEED, init_params  # noqa: E402
from golden_util import (generate_greedy, greedy_config, special_ids,  # noqa: E402
                         write_json, write_safetensors)

SPECS = [
    # head_dim 32 with hidden 64 and 4 heads: the q width (128) differs from
    # hidden, as in Qwen3-0.6B (16 heads x 128 on 1024). GQA, untied.
    {"name": "qwen3-tiny-qknorm", "hidden_size": 64, "num_attention_heads": 4,
     "num_key_value_heads": 2, "head_dim": 32, "attention_bias": False,
     "tie_word_embeddings": False, "intermediate_size": 160, "rope_theta": 1000000.0},
    # attention_bias on, head_dim = hidden / heads (tied embeddings make
    # these tiny random models repeat one token).
    {"name": "qwen3-tiny-bias", "hidden_size": 96, "num_attention_heads": 6,
     "num_key_value_heads": 3, "head_dim": 16, "attention_bias": True,
     "tie_word_embeddings": False, "intermediate_size": 192, "rope_theta": 10000.0},
    # Qwen3-MoE: 8 experts, 2 per token, renormalized (as Qwen3-30B-A3B).
    {"name": "qwen3moe-tiny-top2", "hidden_size": 64, "num_attention_heads": 4,
     "num_key_value_heads": 2, "head_dim": 16, "attention_bias": False,
     "tie_word_embeddings": False, "intermediate_size": 96, "rope_theta": 1000000.0,
     "moe": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
             "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}},
    # 6 experts, 3 per token, raw softmax weights; layer 0 dense.
    {"name": "qwen3moe-tiny-top3-dense0", "hidden_size": 64, "num_attention_heads": 4,
     "num_key_value_heads": 2, "head_dim": 16, "attention_bias": False,
     "tie_word_embeddings": False, "intermediate_size": 96, "rope_theta": 1000000.0,
     "moe": {"num_experts": 6, "num_experts_per_tok": 3, "moe_intermediate_size": 48,
             "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [0]}},
    # Qwen2.5 text (Qwen2ForCausalLM): q/k/v biases always, head_dim = hidden
    # / heads, GQA 4:2, untied.
    {"name": "qwen25-tiny", "qwen2": True, "hidden_size": 64, "num_attention_heads": 4,
     "num_key_value_heads": 2, "head_dim": 16, "attention_bias": True,
     "tie_word_embeddings": False, "intermediate_size": 160, "rope_theta": 1000000.0},
]


def model_class(spec):
    if spec.get("qwen2"):
        return Qwen2Config, Qwen2ForCausalLM
    if spec.get("moe"):
        return Qwen3MoeConfig, Qwen3MoeForCausalLM
    return Qwen3Config, Qwen3ForCausalLM


def build(spec, tok, tok_dir, models_dir):
    ids = special_ids(tok)
    moe = spec.get("moe")
    config_class, model_cls = model_class(spec)
    # Qwen2Config has no head_dim or attention_bias (Qwen2 always has biases).
    extra = {} if spec.get("qwen2") else dict(head_dim=spec["head_dim"],
                                              attention_bias=spec["attention_bias"])
    config = config_class(
        vocab_size=len(tok), hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"], num_hidden_layers=2,
        num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"],
        tie_word_embeddings=spec["tie_word_embeddings"],
        rope_theta=spec["rope_theta"], rms_norm_eps=1e-6, max_position_embeddings=4096,
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"], **extra, **(moe or {}))
    model = model_cls(config)
    init_params(model, SEED)
    if spec["tie_word_embeddings"]:
        model.tie_weights()
    out = os.path.join(models_dir, spec["name"])
    if os.path.exists(out):
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, f), os.path.join(out, f))
    return out


def goldens(path, spec, tok, out_dir):
    model = model_class(spec)[1].from_pretrained(path, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    tensors, prompts = {}, []
    for pname, text in golden_corpus.lm_prompts():
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            logits = model(**enc).logits[0].float()
        tensors[f"logits_last.fp32.{pname}"] = logits[-1]
        new, chosen, margins = generate_greedy(model, tok, enc, LM_NEW_TOKENS)
        print(f"  {spec['name']} {pname}: {len(set(new))} distinct, min margin "
              f"{min(margins):.4f}")
        assert len(set(new)) > 4, f"{spec['name']} {pname}: degenerate greedy {new}"
        prompts.append({"compute_dtype": "fp32", "name": pname, "text": text,
                        "input_ids": enc["input_ids"][0].tolist(), "greedy_ids": new,
                        "greedy_chosen_logit": chosen, "greedy_top2_margin": margins})
    write_safetensors(os.path.join(out_dir, "lm_golden.safetensors"), tensors,
                      {"model": spec["name"], "seed": SEED})
    write_json(os.path.join(out_dir, "lm_golden.json"), {
        "about": ("%s (transformers %s) forward on text prompts, eager "
                  "attention, fp32, batch 1. logits_last.fp32.<prompt> [V] in "
                  "lm_golden.safetensors; greedy: generate do_sample=False, "
                  "max_new_tokens=min_new_tokens=%d (eos ids masked until the end)."
                  % (type(model).__name__, transformers.__version__, LM_NEW_TOKENS)),
        "model": spec["name"],
        "eos_ids_masked": greedy_config(tok)["eos_token_id"],
        "prompts": prompts,
    })


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    testdata = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model", "testdata")
    tok_dir = os.path.join(testdata, "tokenizer")
    tok = Qwen2TokenizerFast.from_pretrained(tok_dir)
    only = sys.argv[1:]  # names to (re)write; default all
    for spec in SPECS:
        if only and spec["name"] not in only:
            continue
        path = build(spec, tok, tok_dir, os.path.join(testdata, "models"))
        goldens(path, spec, tok, os.path.join(testdata, "goldens", spec["name"]))


if __name__ == "__main__":
    main()
