"""The Hugging Face layout of a Qwen2-VL model directory, shared by the
golden generator (tools/gen_goldens.py) and the demo model trainer
(tools/demo/): the tokenizer's split pattern, the chat template, the image
preprocessor config and config.json. Pure data and dict builders.
"""

import transformers

from golden_util import SPECIAL_TOKENS  # noqa: F401  (re-exported)

# The pre-tokenizer regex of Qwen2's tokenizer.json, verbatim.
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2-VL-Instruct's chat template, verbatim (tokenizer_config.json).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def preprocessor_config(min_pixels, max_pixels):
    """preprocessor_config.json of Qwen2-VL with the given pixel bounds."""
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_processor_type": "Qwen2VLImageProcessor",
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "max_pixels": max_pixels,
        "merge_size": 2,
        "min_pixels": min_pixels,
        "patch_size": 14,
        "processor_class": "Qwen2VLProcessor",
        "resample": 3,
        "rescale_factor": 0.00392156862745098,
        "temporal_patch_size": 2,
    }


def flat_config(spec, vocab_size, ids, *, num_hidden_layers, max_position_embeddings,
                rms_norm_eps, rope_theta, sliding_window, tie_word_embeddings, torch_dtype):
    """config.json the way the published Qwen2-VL checkpoints write it (flat:
    text settings at the top level, rope_scaling type "mrope").

    spec: hidden_size, intermediate_size, num_attention_heads,
    num_key_value_heads, mrope_section and vision {depth, embed_dim,
    num_heads, mlp_ratio}; ids: special token -> id; the keyword arguments
    are what the callers choose differently."""
    v = spec["vision"]
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "attention_dropout": 0.0,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "hidden_act": "silu",
        "hidden_size": spec["hidden_size"],
        "image_token_id": ids["<|image_pad|>"],
        "initializer_range": 0.02,
        "intermediate_size": spec["intermediate_size"],
        "max_position_embeddings": max_position_embeddings,
        "max_window_layers": num_hidden_layers,
        "model_type": "qwen2_vl",
        "num_attention_heads": spec["num_attention_heads"],
        "num_hidden_layers": num_hidden_layers,
        "num_key_value_heads": spec["num_key_value_heads"],
        "rms_norm_eps": rms_norm_eps,
        "rope_scaling": {"mrope_section": spec["mrope_section"], "type": "mrope"},
        "rope_theta": rope_theta,
        "sliding_window": sliding_window,
        "tie_word_embeddings": tie_word_embeddings,
        "torch_dtype": torch_dtype,
        "transformers_version": transformers.__version__,
        "use_cache": True,
        "use_sliding_window": False,
        "video_token_id": ids["<|video_pad|>"],
        "vision_config": {
            "depth": v["depth"],
            "embed_dim": v["embed_dim"],
            "hidden_act": "quick_gelu",
            "hidden_size": spec["hidden_size"],
            "in_chans": 3,
            "mlp_ratio": v["mlp_ratio"],
            "model_type": "qwen2_vl",
            "num_heads": v["num_heads"],
            "patch_size": 14,
            "spatial_merge_size": 2,
            "spatial_patch_size": 14,
            "temporal_patch_size": 2,
        },
        "vision_end_token_id": ids["<|vision_end|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_token_id": ids["<|vision_pad|>"],
        "vocab_size": vocab_size,
    }
