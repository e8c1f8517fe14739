#!/usr/bin/env python3
"""Trains the demo model: a tiny Qwen2-VL that answers questions about
procedurally drawn shapes (tools/demo/shapes.py), from scratch, on CPU.

Stages (one command does all of them):
  1. byte-level BPE tokenizer (Qwen2 structure, Qwen2-VL special tokens),
  2. Qwen2VLForConditionalGeneration from a tiny Qwen2VLConfig (MODEL_SPEC),
  3. training on freshly generated samples, loss on the answer tokens only,
     AdamW with linear warmup + cosine decay; a checkpoint every --ckpt-every
     steps under --work (outside the repo); resumes from the latest one there,
  4. export in Hugging Face layout to --out (default models/shapes-demo).

  nice -n 19 python tools/demo/train.py --steps 4000 --work /tmp/shapes-demo-work
  nice -n 19 python tools/demo/train.py --steps 7000 --work /tmp/shapes-demo-work  # resumes
  python tools/demo/train.py --export-only --work /tmp/shapes-demo-work   # latest ckpt -> --out
(the committed model: both commands, see tools/demo/README.md)
"""

import argparse
import copy
import json
import math
import os
import random
import shutil
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import fastpath  # noqa: E402
import shapes  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# head_dim = 128 / 4 = 32; mrope_section sums to head_dim / 2 = 16.
# Vision: 96 / 4 heads = head_dim 24. Sized for ~0.3-0.6 s/step on one contended core.
MODEL_SPEC = {
    "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "mrope_section": [4, 6, 6],
    "vision": {"depth": 3, "embed_dim": 96, "num_heads": 4, "mlp_ratio": 3},
}


def build_model(tok, spec):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    ids = common.special_ids(tok)
    cfg_dict = common.flat_config(spec, len(tok), ids)
    # Qwen2VLConfig rewrites rope_scaling in place ("mrope" -> "default"): give
    # it a copy, so config.json keeps the real checkpoints' {"type": "mrope"}.
    config = Qwen2VLConfig(**{k: copy.deepcopy(v) for k, v in cfg_dict.items()
                              if k not in ("torch_dtype", "transformers_version")})
    config.vision_config.in_channels = 3
    torch.manual_seed(common.INIT_SEED)
    model = Qwen2VLForConditionalGeneration(config)
    init_weights(model, spec)
    return model, cfg_dict


RESIDUAL_OUT = (".o_proj.", ".down_proj.", ".attn.proj.", ".mlp.fc2.")


@torch.no_grad()
def init_weights(model, spec):
    """Fan-in scaled init. transformers' default (std 0.02 everywhere) is far
    too small for these narrow layers: attention starts uniform and training
    sat at chance level (except background colour) for 1000+ steps. Here
    std = 1/sqrt(fan_in), residual-branch outputs scaled by 1/sqrt(2 * depth),
    embeddings (tied with the LM head) std 0.05; norms 1, biases 0."""
    gen = torch.Generator().manual_seed(common.INIT_SEED)
    n_text, n_vis = spec["num_hidden_layers"], spec["vision"]["depth"]
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith("embed_tokens.weight"):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        elif p.ndim >= 2:
            fan_in = p[0].numel()
            std = fan_in ** -0.5
            if any(k in name for k in RESIDUAL_OUT):
                std /= (2 * (n_vis if name.startswith("model.visual") else n_text)) ** 0.5
            p.copy_(torch.randn(p.shape, generator=gen) * std)
        elif name.endswith(".bias"):
            p.zero_()
        else:  # LayerNorm / RMSNorm weights
            p.fill_(1.0)


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def train_batch(step, batch_size, q_per_image):
    """Fresh samples for one step: batch_size // q_per_image new scenes, each
    asked q_per_image questions of different types. Also the scenes."""
    rng = random.Random(common.TRAIN_SEED_BASE + step)
    images, items, scenes = [], [], []
    for i in range(batch_size // q_per_image):
        scene = shapes.random_scene(rng)
        scenes.append(scene)
        images.append(shapes.render(scene))
        for qtype in rng.sample(shapes.QUESTION_TYPES, q_per_image):
            q, a = shapes.question(scene, qtype, rng)
            items.append((i, qtype, q, a))
    return images, items, scenes


# Auxiliary losses (training only, heads not exported):
# - on the vision tower's output: for each of the 3x3 merged image tokens (the
#   28x28 px scene cells), the colour / shape / size of the object in it,
#   class 0 = none. Without it the vision tower learned nothing but the
#   background colour in 1000 steps; with it local features come first.
# - on the language model's hidden states after layer AUX_POS_LAYER at the
#   image tokens: which of the 9 cells the token is (M-RoPE gives only
#   relative positions), so "where is ..." answers can be read off.
AUX_CLASSES = [["none"] + sorted(shapes.COLORS), ["none"] + shapes.SHAPES, ["none", "small", "large"]]
AUX_KEYS = ["color", "shape", "size"]


def aux_targets(scenes):
    grid = shapes.IMAGE_SIZE // 28  # 3: the scene's cells are the merged tokens
    t = torch.zeros((len(scenes), grid * grid, 3), dtype=torch.long)
    for i, sc in enumerate(scenes):
        for o in sc["objects"]:
            cell = min(int(o["cy"] // 28), grid - 1) * grid + min(int(o["cx"] // 28), grid - 1)
            for k, (key, classes) in enumerate(zip(AUX_KEYS, AUX_CLASSES)):
                t[i, cell, k] = classes.index(o[key])
    return t


AUX_POS_LAYER = 2


class AuxHead(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.heads = torch.nn.ModuleList(torch.nn.Linear(hidden, len(c)) for c in AUX_CLASSES)
        self.pos = torch.nn.Linear(hidden, common.IMAGE_TOKENS)

    def loss(self, feats, targets, lm_image_states):
        """feats [images, 9, hidden] (merger output), targets [images, 9, 3],
        lm_image_states [sequences, 9, hidden]."""
        ce = torch.nn.functional.cross_entropy
        vis = sum(ce(h(feats).flatten(0, 1), targets[..., k].flatten())
                  for k, h in enumerate(self.heads))
        cells = torch.arange(lm_image_states.shape[1]).repeat(lm_image_states.shape[0])
        pos = ce(self.pos(lm_image_states).flatten(0, 1), cells)
        return (vis + pos) / (len(self.heads) + 1)


def val_set(n):
    rng = random.Random(common.VAL_SEED)
    out = []
    for i in range(n):
        scene = shapes.random_scene(rng)
        qtype = shapes.QUESTION_TYPES[i % len(shapes.QUESTION_TYPES)]
        q, a = shapes.question(scene, qtype, rng)
        out.append((shapes.render(scene), qtype, q, a))
    return out


@torch.no_grad()
def teacher_forced_accuracy(model, enc, samples, bs=64):
    """Exact match under teacher forcing: a sample counts when the argmax is the
    target at every answer position (answer tokens + <|im_end|>), which is
    exactly when greedy decoding produces the answer and stops."""
    model.eval()
    per = {}
    for i in range(0, len(samples), bs):
        chunk = samples[i:i + bs]
        b = enc.batch(chunk)
        labels = b.pop("labels")
        logits = model(**b).logits
        pred = logits[:, :-1].argmax(-1)
        tgt = labels[:, 1:]
        ok = ((pred == tgt) | (tgt == -100)).all(-1)
        for s, o in zip(chunk, ok.tolist()):
            per.setdefault(s[1], []).append(o)
    model.train()
    acc = {k: sum(v) / len(v) for k, v in sorted(per.items())}
    acc["all"] = sum(sum(v) for v in per.values()) / sum(len(v) for v in per.values())
    return acc


def save_ckpt(path, model, aux, opt, step, extra):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "aux": aux.state_dict(), "opt": opt.state_dict(),
                "step": step,
                "extra": extra}, tmp)
    os.replace(tmp, path)


def export(model, tok_dir, cfg_dict, out):
    """Hugging Face layout: config.json (flat, like the real checkpoints),
    model.safetensors, generation_config.json, preprocessor_config.json,
    tokenizer.json, tokenizer_config.json, chat_template.json. Keeps an
    existing README.md."""
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f not in ("README.md", "eval"):
            p = os.path.join(out, f)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    model.save_pretrained(out, safe_serialization=True)
    common.write_json(os.path.join(out, "config.json"), cfg_dict)
    tok = common.load_tokenizer(tok_dir)
    common.write_json(os.path.join(out, "generation_config.json"),
                      common.generation_config(common.special_ids(tok)))
    common.write_json(os.path.join(out, "preprocessor_config.json"), common.PREPROCESSOR_CONFIG)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, f), os.path.join(out, f))
    # The same template for AutoProcessor, as Qwen2-VL-Instruct ships it.
    common.write_json(os.path.join(out, "chat_template.json"),
                      {"chat_template": common.CHAT_TEMPLATE})


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "models", "shapes-demo"))
    ap.add_argument("--work", default="/tmp/shapes-demo-work",
                    help="tokenizer + checkpoints + log (keep outside the repo)")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=48, help="questions per step")
    ap.add_argument("--q-per-image", type=int, default=3,
                    help="questions asked about each fresh image in a batch")
    ap.add_argument("--aux-weight", type=float, default=1.0,
                    help="weight of the auxiliary per-image-token loss (vision tower)")
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads; 1 beats 2 on a busy 2-core machine")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--val-every", type=int, default=200)
    ap.add_argument("--val-n", type=int, default=300)
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--export-only", action="store_true",
                    help="write --out from the latest checkpoint and stop")
    ap.add_argument("--fresh", action="store_true", help="ignore checkpoints in --work")
    args = ap.parse_args()
    common.set_threads(args.threads)
    fastpath.install()

    tok_dir = os.path.join(args.work, "tokenizer")
    os.makedirs(args.work, exist_ok=True)
    if not os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
        base = common.build_tokenizer(tok_dir)
        print(f"tokenizer: {base} BPE tokens + {len(common.SPECIAL_TOKENS)} special", flush=True)
    tok = common.load_tokenizer(tok_dir)
    enc = common.Encoder(tok)
    model, cfg_dict = build_model(tok, MODEL_SPEC)
    n_params = sum(p.numel() for p in model.parameters())
    n_vis = sum(p.numel() for p in model.model.visual.parameters())
    print(f"model: {n_params} parameters ({n_vis} vision), vocab {len(tok)}", flush=True)

    torch.manual_seed(common.INIT_SEED + 1)
    aux = AuxHead(MODEL_SPEC["hidden_size"])
    params = list(model.named_parameters()) + list(aux.named_parameters())
    decay = [p for n, p in params if p.ndim >= 2]
    no_decay = [p for n, p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98), eps=1e-8)
    ckpt = os.path.join(args.work, "ckpt.pt")
    start = 0
    history = []
    if os.path.exists(ckpt) and not args.fresh:
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        aux.load_state_dict(state["aux"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        history = state["extra"].get("history", [])
        print(f"resumed from {ckpt} at step {start}", flush=True)
    if args.export_only:
        export(model, tok_dir, cfg_dict, args.out)
        print(f"exported step {start} to {args.out}")
        return

    val = val_set(args.val_n)
    model.train()
    t0, seen, loss_acc, aux_acc = time.time(), 0, 0.0, 0.0
    for step in range(start, args.steps):
        lr = lr_at(step, args)
        for g in opt.param_groups:
            g["lr"] = lr
        images, items, scenes = train_batch(step, args.batch, args.q_per_image)
        b = enc.batch_shared(images, items)
        out = fastpath.forward_shared(model, b, return_image_feats=True, output_hidden_states=True)
        hs = out.hidden_states[AUX_POS_LAYER]
        lm_img = hs[b["input_ids"] == model.config.image_token_id].reshape(
            hs.shape[0], common.IMAGE_TOKENS, -1)
        aux_loss = aux.loss(out.image_feats, aux_targets(scenes), lm_img)
        loss = out.loss
        (loss + args.aux_weight * aux_loss).backward()
        aux_acc += aux_loss.item()
        gn = torch.nn.utils.clip_grad_norm_([p for _, p in params], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_acc += loss.item()
        seen += 1
        done = step + 1
        if done % args.log_every == 0:
            dt = (time.time() - t0) / seen
            print(f"step {done}/{args.steps} loss {loss_acc / seen:.4f} aux {aux_acc / seen:.4f} lr {lr:.2e} "
                  f"gnorm {float(gn):.2f} {dt:.2f}s/step eta {dt * (args.steps - done) / 60:.1f}min",
                  flush=True)
            t0, seen, loss_acc, aux_acc = time.time(), 0, 0.0, 0.0
        if done % args.val_every == 0 or done == args.steps:
            tv = time.time()
            acc = teacher_forced_accuracy(model, enc, val)
            history.append({"step": done, "acc": acc})
            print(f"val step {done}: " + " ".join(f"{k} {v:.3f}" for k, v in acc.items())
                  + f" ({time.time() - tv:.0f}s)", flush=True)
            t0 = time.time()
            seen, loss_acc, aux_acc = 0, 0.0, 0.0
        if done % args.ckpt_every == 0 or done == args.steps:
            save_ckpt(ckpt, model, aux, opt, done, {"history": history, "args": vars(args)})
    export(model, tok_dir, cfg_dict, args.out)
    common.write_json(os.path.join(args.work, "history.json"), history)
    print(f"exported to {args.out}", flush=True)


if __name__ == "__main__":
    main()
