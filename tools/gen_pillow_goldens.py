#!/usr/bin/env python3
"""Writes model/testdata/pillow/: goldens that pin mmserve's image pipeline to
Pillow and to transformers' slow (Pillow) Qwen2-VL processor, byte for byte,
and measure the fast (torchvision) processor against the slow one.

- sizes.json: 70+ source sizes (common photo and screen sizes in both
  orientations, squares, odd sizes, extreme aspect ratios, below min_pixels,
  above max_pixels). The source pixels are not stored: they come from
  synth(), a small integer formula that model/image_golden_test.cc
  reimplements (it checks the hash of its own source first). For each size:
  the grid, XXH3-64 hashes of the resized uint8 RGB image and of
  pixel_values (float32 little-endian) from Qwen2VLImageProcessor (slow), and
  how far Qwen2VLImageProcessorFast's pixel_values are from them.
- jpeg/*.jpg + jpeg.json: a JPEG set written by Pillow (libjpeg-turbo):
  baseline and progressive; 4:4:4, 4:2:2, 4:2:0; grayscale; CMYK and YCCK
  (Adobe transform 2, made by flipping the transform byte of a CMYK file);
  restart markers; optimized Huffman tables; quality 50-95; sizes that are
  not multiples of the MCU. For each: the hash of Pillow's decode
  (convert("RGB")), and the same processor hashes and fast-vs-slow figures.
- png/*.png + png.json: the conversions convert("RGB") makes: 16-bit gray
  (clipped to 255 by Pillow), 16-bit gray+alpha, RGB and RGBA, palette with
  and without transparency, 1/2/4-bit gray and palette, gray+alpha, RGBA.

Hashes are xxhash.xxh3_64 (seed 0), the same function as mmserve::Hash64.
Run with the tools venv (tools/README.md) (xxhash is in tools/requirements.txt):
  python tools/gen_pillow_goldens.py
Deterministic: re-running rewrites identical files.
"""
import io
import json
import os

import numpy as np
import torch
import xxhash
from PIL import Image
from transformers import Qwen2VLImageProcessor, Qwen2VLImageProcessorFast

OUT = os.path.join(os.path.dirname(__file__), "..", "model", "testdata", "pillow")
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 1280

LANDSCAPE = [(640, 480), (800, 600), (1024, 768), (1280, 720), (1280, 960), (1366, 768),
             (1440, 900), (1600, 900), (1600, 1200), (1920, 1080), (1920, 1200), (2048, 1536),
             (2560, 1440), (500, 375), (320, 240), (3000, 2000), (4032, 3024), (1080, 720)]
SIZES = (LANDSCAPE + [(h, w) for w, h in LANDSCAPE] +
         [(224, 224), (256, 256), (448, 448), (512, 512), (1024, 1024), (1080, 1080)] +
         # odd sizes
         [(333, 517), (97, 61), (1001, 999), (123, 457), (775, 389), (59, 59), (641, 479),
          (1279, 721)] +
         # extreme aspect ratios (up to the 200:1 limit)
         [(2000, 20), (20, 2000), (3000, 16), (16, 3000), (1200, 8), (56, 5000), (5600, 29)] +
         # below min_pixels
         [(40, 30), (20, 20), (10, 50), (56, 56), (1, 1), (29, 31)] +
         # above max_pixels
         [(3840, 2160), (2160, 3840), (5000, 300), (1500, 1500)])


def synth(w, h, seed=0):
    """A photo-like uint8 RGB image from integer arithmetic only (gradients,
    hash noise, hard edges), reproducible in C++ (SynthImage in
    model/image_golden_test.cc)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.uint32)
    out = np.empty((h, w, 3), np.uint8)
    for c in range(3):
        n = (x * np.uint32(73856093)) ^ (y * np.uint32(19349663)) ^ np.uint32(((c + 3 * seed) * 83492791) & 0xFFFFFFFF)
        n = (n ^ (n >> np.uint32(13))) * np.uint32(1274126177)
        n = n ^ (n >> np.uint32(16))
        grad = (x * np.uint32(255) // np.uint32(max(w - 1, 1)) * np.uint32(c + 1) +
                y * np.uint32(255) // np.uint32(max(h - 1, 1)) * np.uint32(3 - c)) // np.uint32(4)
        edge = ((x // np.uint32(23) + y // np.uint32(17) + np.uint32(c)) % np.uint32(3)) * np.uint32(50)
        out[:, :, c] = ((grad + edge + (n & np.uint32(63))) % np.uint32(256)).astype(np.uint8)
    return out


def h64(arr):
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(arr).tobytes())


SLOW = Qwen2VLImageProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
FAST = Qwen2VLImageProcessorFast(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
STD = np.array(SLOW.image_std, np.float32)


def process(rgb):
    """Slow processor's resize + pixel_values, and the fast one's distance.
    input_data_format is given because transformers guesses channels-first
    for images of 1-3 pixels per side and then fails."""
    img = Image.fromarray(rgb)
    slow = SLOW(images=[img], return_tensors="np", input_data_format="channels_last")
    grid = [int(v) for v in slow["image_grid_thw"][0]]
    rh, rw = grid[1] * SLOW.patch_size, grid[2] * SLOW.patch_size
    resized = np.asarray(img.resize((rw, rh), resample=Image.BICUBIC), dtype=np.uint8)
    pv = slow["pixel_values"].astype("<f4")
    rec = {"grid_thw": grid, "resized_hw": [rh, rw], "resized_xxh64": h64(resized),
           "pixel_values_xxh64": h64(pv), "pixel_values_shape": list(pv.shape)}
    try:
        fast = FAST(images=[img], return_tensors="pt")
    except (ValueError, RuntimeError) as e:  # the 1x1 image
        rec["fast"] = {"error": str(e)[:120]}
        return rec
    fgrid = [int(v) for v in fast["image_grid_thw"][0]]
    if fgrid != grid:
        rec["fast"] = {"grid_thw": fgrid}
        return rec
    fpv = fast["pixel_values"].to(torch.float32).numpy()
    d = np.abs(fpv - pv)
    # In 8-bit levels: |diff| * std * 255 (channel of each value: patch dim
    # is (c, t, p, p), so the channel is index // (dim / 3)).
    dim = pv.shape[1]
    ch = (np.arange(dim) // (dim // 3))
    levels = d * STD[ch][None, :] * 255.0
    rec["fast"] = {"max_abs": float(d.max()), "mean_abs": float(d.mean()),
                   "frac_differ": float((d > 0).mean()),
                   "max_levels": float(np.round(levels.max(), 3)),
                   "frac_over_half_level": float((levels > 0.5).mean())}
    return rec


def sizes():
    out = []
    for w, h in SIZES:
        rgb = synth(w, h)
        rec = {"width": w, "height": h, "source_xxh64": h64(rgb)}
        rec.update(process(rgb))
        out.append(rec)
        print("size", w, h, rec["grid_thw"], rec["fast"])
    return out


def jpeg_set():
    os.makedirs(f"{OUT}/jpeg", exist_ok=True)
    cases = []
    # (name, size, mode, save kwargs)
    for q in (50, 75, 90, 95):
        cases.append((f"q{q}_420", (161, 121), "RGB", {"quality": q, "subsampling": "4:2:0"}))
    for sub in ("4:4:4", "4:2:2", "4:2:0"):
        tag = sub.replace(":", "")
        cases.append((f"q85_{tag}_odd", (97, 71), "RGB", {"quality": 85, "subsampling": sub}))
        cases.append((f"q85_{tag}_progressive", (130, 98), "RGB",
                      {"quality": 85, "subsampling": sub, "progressive": True}))
    cases += [
        ("gray_q90", (101, 77), "L", {"quality": 90}),
        ("gray_progressive", (64, 200), "L", {"quality": 80, "progressive": True}),
        ("cmyk_q90", (90, 66), "CMYK", {"quality": 90}),
        ("restart_blocks", (150, 90), "RGB", {"quality": 80, "restart_marker_blocks": 3}),
        ("restart_rows_444", (120, 100), "RGB",
         {"quality": 80, "restart_marker_rows": 1, "subsampling": "4:4:4"}),
        ("optimized", (140, 60), "RGB", {"quality": 70, "optimize": True}),
        ("tiny_1x1", (1, 1), "RGB", {"quality": 90}),
        ("tiny_9x17", (9, 17), "RGB", {"quality": 90}),
        ("photo_640x480", (640, 480), "RGB", {"quality": 80}),
        ("photo_480x640_progressive", (480, 640), "RGB", {"quality": 75, "progressive": True}),
    ]
    out = []
    for name, (w, h), mode, kw in cases:
        img = Image.fromarray(synth(w, h, seed=len(out) + 1))
        if mode != "RGB":
            img = img.convert(mode)
        buf = io.BytesIO()
        img.save(buf, "JPEG", **kw)
        data = buf.getvalue()
        out.append(write_jpeg(name, data, kw, mode))
        if name == "cmyk_q90":
            # The same file with the Adobe marker's transform flag set to 2
            # (YCCK): the decoder must run YCC -> RGB on the first three
            # components. Pillow writes transform 0 for CMYK.
            at = data.find(b"Adobe")
            assert at > 0 and data[at - 4:at - 2] == b"\xff\xee"
            flag = at + 5 + 2 + 2 + 2  # "Adobe", version, flags0, flags1, then transform
            assert data[flag] == 0, data[flag]
            ycck = data[:flag] + b"\x02" + data[flag + 1:]
            out.append(write_jpeg("ycck_q90", ycck, dict(kw, adobe_transform=2), "CMYK"))
    return out


def write_jpeg(name, data, kw, mode):
    path = f"{OUT}/jpeg/{name}.jpg"
    with open(path, "wb") as f:
        f.write(data)
    with Image.open(path) as src:
        info = {"mode": src.mode, "adobe_transform": src.info.get("adobe_transform")}
        rgb = np.asarray(src.convert("RGB"), dtype=np.uint8)
    rec = {"file": f"jpeg/{name}.jpg", "save": {k: v for k, v in kw.items()}, "pillow": info,
           "width": int(rgb.shape[1]), "height": int(rgb.shape[0]), "decoded_xxh64": h64(rgb)}
    rec.update(process(rgb))
    print("jpeg", name, len(data), info, rec["fast"])
    return rec


def png_set():
    os.makedirs(f"{OUT}/png", exist_ok=True)
    w, h = 45, 33
    base = synth(w, h, seed=7)
    y, x = np.mgrid[0:h, 0:w]
    ramp16 = ((x * 1499 + y * 977) % 65536).astype(np.uint16)
    low16 = ((x * 7 + y * 5) % 400).astype(np.uint16)  # mostly below 256
    alpha = ((x * 255) // (w - 1)).astype(np.uint8)
    files = {}
    files["gray16_ramp"] = Image.fromarray(ramp16)
    files["gray16_low"] = Image.fromarray(low16)
    files["gray8"] = Image.fromarray(base[:, :, 1])
    files["gray_alpha8"] = Image.merge("LA", [Image.fromarray(base[:, :, 0]), Image.fromarray(alpha)])
    files["rgba8"] = Image.fromarray(np.dstack([base, alpha]))
    files["palette8"] = Image.fromarray(base).convert("P", palette=Image.ADAPTIVE, colors=200)
    pal_t = Image.fromarray(base).convert("P", palette=Image.ADAPTIVE, colors=16)
    pal_t.info["transparency"] = 3
    files["palette4_trns"] = pal_t
    files["gray1"] = Image.fromarray(base[:, :, 2] > 128).convert("1")
    out = []
    for name, img in files.items():
        path = f"{OUT}/png/{name}.png"
        kw = {}
        if name == "palette4_trns":
            kw = {"transparency": 3, "bits": 4}
        img.save(path, "PNG", **kw)
        out.append(write_png(name, path))
    # Bit depths Pillow cannot write directly: raw PNG chunks.
    out.append(write_png("gray16_alpha", raw_png(f"{OUT}/png/gray16_alpha.png", w, h, 16, 4,
                                                   np.dstack([ramp16, ramp16[::-1]]))))
    out.append(write_png("rgb16", raw_png(f"{OUT}/png/rgb16.png", w, h, 16, 2,
                                            np.dstack([ramp16, low16, ramp16[:, ::-1]]))))
    out.append(write_png("rgba16", raw_png(f"{OUT}/png/rgba16.png", w, h, 16, 6,
                                             np.dstack([ramp16, low16, ramp16[:, ::-1], ramp16]))))
    out.append(write_png("gray2", raw_png(f"{OUT}/png/gray2.png", w, h, 2, 0,
                                            (base[:, :, 0] >> 6).astype(np.uint8))))
    out.append(write_png("gray4", raw_png(f"{OUT}/png/gray4.png", w, h, 4, 0,
                                            (base[:, :, 1] >> 4).astype(np.uint8))))
    return out


def raw_png(path, w, h, depth, color_type, samples):
    """Writes a PNG with the given bit depth and colour type (no filtering)."""
    import struct
    import zlib
    s = samples.reshape(h, w, -1)
    rows = []
    for r in range(h):
        if depth == 16:
            row = s[r].astype(">u2").tobytes()
        elif depth == 8:
            row = s[r].astype(np.uint8).tobytes()
        else:
            per = 8 // depth
            vals = s[r, :, 0].astype(np.uint8)
            pad = (-len(vals)) % per
            vals = np.concatenate([vals, np.zeros(pad, np.uint8)]).reshape(-1, per)
            row = bytes(int(sum(int(v) << (8 - depth * (i + 1)) for i, v in enumerate(grp)))
                        for grp in vals)
        rows.append(b"\x00" + row)

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))

    ihdr = struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) +
                chunk(b"IDAT", zlib.compress(b"".join(rows), 9)) + chunk(b"IEND", b""))
    return path


def write_png(name, path):
    with Image.open(path) as src:
        mode = src.mode
        rgb = np.asarray(src.convert("RGB"), dtype=np.uint8)
    rec = {"file": f"png/{name}.png", "pillow_mode": mode, "width": int(rgb.shape[1]),
           "height": int(rgb.shape[0]), "decoded_xxh64": h64(rgb)}
    print("png", name, mode)
    return rec


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    about = ("transformers 4.57.6 Qwen2VLImageProcessor (slow, Pillow) and "
             "Qwen2VLImageProcessorFast (torchvision) with min_pixels=%d max_pixels=%d, "
             "Pillow %s; hashes are xxh3_64 of the raw uint8 RGB / float32 LE bytes" %
             (MIN_PIXELS, MAX_PIXELS, Image.__version__))
    for name, fn in (("png", png_set), ("jpeg", jpeg_set), ("sizes", sizes)):
        recs = fn()
        with open(f"{OUT}/{name}.json", "w") as f:
            json.dump({"about": about, "cases": recs}, f, indent=1, sort_keys=True)
            f.write("\n")


if __name__ == "__main__":
    main()
