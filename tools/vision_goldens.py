"""Vision and multimodal goldens for gen_goldens.py.

Writes under <out>/goldens/:
  images/<name>.png            procedurally drawn inputs (PNG, lossless)
  images/<name>.resized.png    HF's resized uint8 RGB image (what gets normalized)
  image_processor.json         per image: sizes, resized size, grid_thw, tokens;
                               smart_resize table for the default and tiny configs
  image_processor.safetensors  pixel_values.<name> [patches, 1176] float32
  <model>/mm_golden.json       multimodal chats: ids, position ids, rope delta, greedy
  <model>/mm_golden.safetensors vision tower outputs and prompt logits
"""

import os

import numpy as np
import torch
from PIL import Image, ImageDraw

from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor
from transformers.image_transforms import resize
from transformers.image_utils import ChannelDimension, PILImageResampling
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

from golden_util import generate_greedy, load_model, write_json, write_safetensors

# (name, width, height, mode). Sizes are (W, H) as PIL writes them.
IMAGES = [
    ("square56", 56, 56, "RGB"),          # exactly min_pixels: no resize
    ("square224", 224, 224, "RGB"),       # above the tiny max_pixels: downscaled
    ("rect300x200", 300, 200, "RGB"),
    ("wide1000x50", 1000, 50, "RGB"),     # extreme aspect ratio (20:1)
    ("tiny20", 20, 20, "RGB"),            # below min_pixels: upscaled
    ("large1600x1200", 1600, 1200, "RGB"),
    ("rgba64x48", 64, 48, "RGBA"),        # alpha is dropped, not composited
    ("gray90x70", 90, 70, "L"),           # grayscale, replicated to RGB
]

# pixel_values are stored for these; every image's resized uint8 PNG is stored
# and determines its pixel_values exactly (checked below).
PIXEL_VALUES_STORED = ["square56", "tiny20", "rect300x200", "rgba64x48", "gray90x70"]

# Image pairs for the vision tower golden (one call, two images: cu_seqlens).
VISION_BATCH = ["square56", "rect300x200"]

MM_CHATS = [
    ("one_image", ["rect300x200"],
     [{"role": "user", "content": [{"type": "image"},
                                   {"type": "text", "text": "Describe this image."}]}]),
    ("two_images", ["square56", "gray90x70"],
     [{"role": "user", "content": [{"type": "text", "text": "Compare "}, {"type": "image"},
                                   {"type": "text", "text": " and "}, {"type": "image"},
                                   {"type": "text", "text": ". Which is wider?"}]}]),
]

SMART_RESIZE_SIZES = [
    (1, 1), (10, 10), (20, 20), (27, 29), (28, 28), (41, 43), (42, 42), (55, 57), (56, 56),
    (100, 100), (200, 300), (224, 224), (300, 200), (333, 777), (480, 640), (720, 1280),
    (1080, 1920), (1200, 1600), (2048, 2048), (3000, 4000), (4000, 3000), (50, 1000),
    (1000, 50), (28, 5600), (28, 5601), (14, 2800), (10, 2001), (5000, 25), (7, 1399),
    (3584, 3584), (4480, 2520), (12, 2400),
    # x/28 exactly .5: Python's round() rounds half to even (2.5 -> 2, 3.5 -> 4)
    (70, 70), (70, 90), (98, 98), (126, 126), (154, 42), (182, 210),
    # just past max_pixels of the release config
    (3584, 3612), (2800, 4600),
]


def draw_image(name, w, h, mode, rng):
    """Deterministic picture: gradient background, shapes, a checkerboard corner."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([
        (x * 255 // max(w - 1, 1)),
        (y * 255 // max(h - 1, 1)),
        ((x + y) * 255 // max(w + h - 2, 1)),
    ], axis=-1).astype(np.uint8)
    img = Image.fromarray(base, "RGB")
    d = ImageDraw.Draw(img)
    for _ in range(4):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(1, w // 2 + 2)), y0 + int(rng.integers(1, h // 2 + 2))
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            d.rectangle([x0, y0, x1, y1], fill=color)
        else:
            d.ellipse([x0, y0, x1, y1], fill=color, outline=(0, 0, 0))
    d.line([0, h - 1, w - 1, 0], fill=(255, 255, 255), width=max(1, min(w, h) // 20))
    cs = max(2, min(w, h) // 8)
    for i in range(0, min(w, 4 * cs), cs):
        for j in range(0, min(h, 4 * cs), cs):
            if (i // cs + j // cs) % 2 == 0:
                d.rectangle([i, j, i + cs - 1, j + cs - 1], fill=(0, 0, 0))
    if mode == "RGBA":
        alpha = np.full((h, w), 255, np.uint8)
        alpha[:, : w // 3] = 0      # fully transparent: HF keeps the RGB underneath
        alpha[:, w // 3: 2 * w // 3] = 128
        img = Image.fromarray(np.dstack([np.asarray(img), alpha]), "RGBA")
    elif mode == "L":
        img = img.convert("L")
    return img


def hf_resized_uint8(proc, img):
    """Reproduces the resize step of Qwen2VLImageProcessor._preprocess (uint8 out)."""
    arr = np.asarray(img.convert("RGB"))
    h, w = arr.shape[:2]
    rh, rw = smart_resize(h, w, factor=proc.patch_size * proc.merge_size,
                          min_pixels=proc.size["shortest_edge"], max_pixels=proc.size["longest_edge"])
    out = resize(arr, size=(rh, rw), resample=PILImageResampling(proc.resample),
                 input_data_format=ChannelDimension.LAST)
    assert out.dtype == np.uint8, out.dtype
    return out


def patchify(proc, resized):
    """Rescale, normalize and patchify in numpy exactly as the processor does."""
    x = proc.rescale(resized, scale=proc.rescale_factor, input_data_format=ChannelDimension.LAST)
    x = proc.normalize(x, mean=proc.image_mean, std=proc.image_std,
                       input_data_format=ChannelDimension.LAST)
    return x


def smart_resize_table():
    rows = []
    configs = [
        ("class_default", 56 * 56, 28 * 28 * 1280),  # Qwen2VLImageProcessor() defaults
        ("qwen2vl_release", 3136, 12845056),  # Qwen2-VL-*-Instruct preprocessor_config.json
        ("tiny", 3136, 12544),  # the tiny models here
    ]
    for cfg_name, mn, mx in configs:
        for h, w in SMART_RESIZE_SIZES:
            try:
                rh, rw = smart_resize(h, w, factor=28, min_pixels=mn, max_pixels=mx)
                rows.append({"config": cfg_name, "min_pixels": mn, "max_pixels": mx,
                             "height": h, "width": w, "resized_height": rh, "resized_width": rw,
                             "grid_thw": [1, rh // 14, rw // 14],
                             "image_tokens": (rh // 28) * (rw // 28)})
            except ValueError as e:
                rows.append({"config": cfg_name, "min_pixels": mn, "max_pixels": mx,
                             "height": h, "width": w, "error": str(e)})
    return rows


def prepare_images(out, tok, preprocessor_config, seed):
    """Draws the images and writes the image processor goldens.

    Returns ({name: PIL image as read back from its PNG}, Qwen2VLProcessor).
    """
    goldens = os.path.join(out, "goldens")
    img_dir = os.path.join(goldens, "images")
    os.makedirs(img_dir, exist_ok=True)
    proc = Qwen2VLImageProcessor.from_dict(preprocessor_config)
    # The video processor is unused but required (it needs torchvision).
    processor = Qwen2VLProcessor(image_processor=proc, tokenizer=tok,
                                 video_processor=Qwen2VLVideoProcessor(),
                                 chat_template=tok.chat_template)

    rng = np.random.default_rng(seed)
    images, per_image, pix = {}, [], {}
    for name, w, h, mode in IMAGES:
        path = os.path.join(img_dir, name + ".png")
        draw_image(name, w, h, mode, rng).save(path, optimize=False, compress_level=9)
        img = Image.open(path)
        img.load()
        images[name] = img
        feats = proc(images=[img], return_tensors="pt")
        pv, grid = feats["pixel_values"], feats["image_grid_thw"][0].tolist()
        resized = hf_resized_uint8(proc, img)
        Image.fromarray(resized, "RGB").save(os.path.join(img_dir, name + ".resized.png"),
                                             compress_level=9)
        # The resized uint8 image fully determines pixel_values: check that.
        norm = patchify(proc, resized)
        t, gh, gw = grid
        assert (gh * 14, gw * 14) == resized.shape[:2]
        first_patch = norm[:28, :28].transpose(2, 0, 1)  # C, 28, 28: merge block (0,0)
        exp = np.stack([first_patch[:, :14, :14]] * 2, axis=1).reshape(-1)  # C, T, 14, 14
        assert np.array_equal(exp.astype(np.float32), pv[0].numpy()), name
        if name in PIXEL_VALUES_STORED:
            pix[f"pixel_values.{name}"] = pv.float()
        per_image.append({
            "name": name, "file": f"images/{name}.png", "resized_file": f"images/{name}.resized.png",
            "mode": mode, "width": w, "height": h,
            "resized_width": int(resized.shape[1]), "resized_height": int(resized.shape[0]),
            "grid_thw": grid, "num_patches": int(pv.shape[0]),
            "image_tokens": t * gh * gw // (proc.merge_size ** 2),
            "pixel_values_stored": name in PIXEL_VALUES_STORED,
            "pixel_values_sum": float(pv.double().sum()),
        })
    write_safetensors(os.path.join(goldens, "image_processor.safetensors"), pix, {"seed": seed})
    write_json(os.path.join(goldens, "image_processor.json"), {
        "about": ("Qwen2VLImageProcessor (slow, PIL) with the tiny models' "
                  "preprocessor_config.json. pixel_values.<name> in image_processor.safetensors "
                  "is [grid_t*grid_h*grid_w, 3*2*14*14] float32, rows in merge-block order "
                  "(2x2 patches of a merge block are consecutive), each row laid out "
                  "[channel][temporal][py][px]; a single image is repeated over temporal_patch_size. "
                  "<name>.resized.png: the uint8 RGB image after convert('RGB') + smart_resize "
                  "+ PIL bicubic resize; pixel_values = ((resized/255) - mean) / std from it "
                  "(checked). smart_resize: factor 28."),
        "preprocessor_config": {k: v for k, v in proc.to_dict().items()
                                if k in ("min_pixels", "max_pixels", "image_mean", "image_std",
                                         "patch_size", "merge_size", "temporal_patch_size",
                                         "resample", "rescale_factor")},
        "images": per_image,
        "smart_resize": smart_resize_table(),
    })

    return images, processor


def mm_golden(path, spec, images, processor, tok, gdir, seed, n_new):
    """Vision tower + multimodal chat goldens for one model; returns the smallest
    fp32 greedy top-2 margin."""
    min_margin = float("inf")
    computes = [("fp32", torch.float32)]
    if spec["dtype"] != "float32":
        computes.append((spec["dtype"], getattr(torch, spec["dtype"])))
    tensors, chats = {}, []
    for cname, cdtype in computes:
        model = load_model(path, cdtype)
        visual = model.model.visual

        # Vision tower on two images in one call, with intermediate activations.
        feats = processor.image_processor(images=[images[n] for n in VISION_BATCH],
                                          return_tensors="pt")
        acts = {}
        hooks = [visual.patch_embed.register_forward_hook(
                     lambda m, i, o: acts.__setitem__("patch_embed", o)),
                 visual.blocks[0].register_forward_hook(
                     lambda m, i, o: acts.__setitem__("block0", o))]
        with torch.no_grad():
            vout = visual(feats["pixel_values"].to(cdtype), grid_thw=feats["image_grid_thw"])
        for hk in hooks:
            hk.remove()
        key = f"{cname}." + "+".join(VISION_BATCH)
        tensors[f"vision_out.{key}"] = vout.float()
        tensors[f"vision_patch_embed.{key}"] = acts["patch_embed"].float()
        tensors[f"vision_block0.{key}"] = acts["block0"].float()

        for chat_name, img_names, messages in MM_CHATS:
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            inputs = processor(text=[text], images=[images[n] for n in img_names],
                               return_tensors="pt")
            inputs["pixel_values"] = inputs["pixel_values"].to(cdtype)
            with torch.no_grad():
                pos, delta = model.model.get_rope_index(inputs["input_ids"],
                                                        inputs["image_grid_thw"], None,
                                                        inputs["attention_mask"])
                logits = model(**inputs).logits[0].float()
            tensors[f"logits_last.{cname}.{chat_name}"] = logits[-1]
            new, chosen, margins = generate_greedy(model, tok, inputs, n_new)
            print(f"  {spec['name']} {cname} {chat_name}: {len(set(new))} distinct, "
                  f"min margin {min(margins):.4f}")
            entry = {"name": chat_name, "compute_dtype": cname, "greedy_ids": new,
                     "greedy_text": tok.decode(new), "greedy_chosen_logit": chosen,
                     "greedy_top2_margin": margins,
                     "logits_last_argmax": int(logits[-1].argmax())}
            if cname == "fp32":
                entry.update({
                    "images": img_names,
                    "messages": messages,
                    "rendered": text,
                    "input_ids": inputs["input_ids"][0].tolist(),
                    "image_grid_thw": inputs["image_grid_thw"].tolist(),
                    "position_ids": pos[:, 0].tolist(),
                    "rope_delta": int(delta.flatten()[0]),
                })
            chats.append(entry)
            if cname == "fp32":
                min_margin = min(min_margin, min(margins))
        del model

    write_safetensors(os.path.join(gdir, "mm_golden.safetensors"), tensors,
                      {"model": spec["name"], "seed": seed})
    write_json(os.path.join(gdir, "mm_golden.json"), {
        "about": ("Vision tower (model.visual) on images %s in ONE call (grid_thw stacked, "
                  "attention block-diagonal per image via cu_seqlens): vision_out.<compute>.<imgs> "
                  "[tokens, hidden] (after the 2x2 merger), vision_patch_embed [patches, "
                  "embed_dim], vision_block0 [patches, embed_dim]. Chats: processor(text=chat "
                  "template, images) expands each <|image_pad|> to t*h*w/4 copies; position_ids "
                  "[3][L] from get_rope_index; rope_delta = max(position)+1-L; decode step at "
                  "cache position c uses position c+rope_delta in all three rows. greedy as in "
                  "lm_golden.json (eos masked, no repetition penalty)." % VISION_BATCH),
        "model": spec["name"],
        "vision_batch": VISION_BATCH,
        "vision_batch_grid_thw": processor.image_processor(
            images=[images[n] for n in VISION_BATCH], return_tensors="pt")["image_grid_thw"].tolist(),
        "chats": chats,
    })
    return min_margin
