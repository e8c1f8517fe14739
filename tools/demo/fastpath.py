"""Training-only speed-ups for tiny Qwen2-VL on CPU; the same math as
transformers' own code (checked by check() to float rounding):

- PatchEmbed: the Conv3d whose kernel equals its stride is a matmul.
- VisionAttention: when every image has the same number of patches (true
  here: one fixed image size), one batched SDPA call instead of one per image.
- forward_shared(): each image's vision features computed once and scattered
  into several question sequences (what Qwen2VLModel.forward does per
  sequence), positions from the model's own get_rope_index.
"""

import torch
import torch.nn.functional as F
from transformers.models.qwen2_vl import modeling_qwen2_vl as m


def _patch_embed_forward(self, hidden_states):
    w = self.proj.weight
    x = hidden_states.reshape(-1, w[0].numel()).to(w.dtype)
    return F.linear(x, w.reshape(w.shape[0], -1))


_orig_attn_forward = m.VisionAttention.forward


def _vision_attn_forward(self, hidden_states, cu_seqlens, rotary_pos_emb=None,
                         position_embeddings=None, **kwargs):
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    if self.config._attn_implementation != "sdpa" or (lengths != lengths[0]).any():
        return _orig_attn_forward(self, hidden_states, cu_seqlens, rotary_pos_emb,
                                  position_embeddings, **kwargs)
    n = hidden_states.shape[0]
    b, L = lengths.numel(), int(lengths[0])
    q, k, v = self.qkv(hidden_states).reshape(n, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
    cos, sin = position_embeddings
    q, k = m.apply_rotary_pos_emb_vision(q, k, cos, sin)
    # [n, heads, d] -> [b, heads, L, d]
    q, k, v = (t.reshape(b, L, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, scale=self.scaling)
    o = o.transpose(1, 2).reshape(n, -1)
    return self.proj(o)


def install():
    m.PatchEmbed.forward = _patch_embed_forward
    m.VisionAttention.forward = _vision_attn_forward


def forward_shared(model, batch, return_image_feats=False, **kwargs):
    """batch: input_ids, attention_mask, labels, pixel_values (one entry per
    distinct image), image_grid_thw (per sequence), image_of_seq (image index
    of each sequence). Returns the model output (with .loss when labels)."""
    inner = model.model
    ids = batch["input_ids"]
    n_img = batch["pixel_values"].shape[0] // int(batch["image_grid_thw"][0].prod())
    thw_img = batch["image_grid_thw"][:1].expand(n_img, 3)
    feats = torch.cat(inner.get_image_features(batch["pixel_values"], thw_img), dim=0)
    per = feats.shape[0] // n_img
    image_feats = feats.reshape(n_img, per, -1)
    feats = image_feats[batch["image_of_seq"]].reshape(-1, feats.shape[-1])
    emb = inner.get_input_embeddings()(ids)
    mask = (ids == model.config.image_token_id).unsqueeze(-1).expand_as(emb)
    assert int(mask[..., 0].sum()) == feats.shape[0]
    emb = emb.masked_scatter(mask, feats.to(emb.dtype))
    out = model(input_ids=ids, inputs_embeds=emb, attention_mask=batch["attention_mask"],
                image_grid_thw=batch["image_grid_thw"], labels=batch.get("labels"), **kwargs)
    if return_image_feats:
        out.image_feats = image_feats
    return out
