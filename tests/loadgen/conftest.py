"""Shared fixtures: a tiny byte-level BPE tokenizer saved as a checkpoint directory."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint dir holding only tokenizer.json: byte-level BPE trained on a short text, so
    every string encodes (byte fallback) and tests need no model download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    text = ["the quick brown fox jumps over the lazy dog", "what is the difference between a list and"] * 20
    tok.train_from_iterator(text, trainer=trainer)
    d = tmp_path_factory.mktemp("ckpt")
    tok.save(str(d / "tokenizer.json"))
    return d
