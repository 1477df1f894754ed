"""A stand-in for the model runner, for scheduler / allocator / engine-plumbing tests only.

The next token is a pure function of (request key, output index), where the key is the request's
seed, or a hash of the prompt's first tokens. That is what the real runner guarantees for seeded
sampling, and it makes preemption-and-recompute checkable: the outputs must not change. The fake also
checks what the scheduler hands it: decodes first, block tables covering every token, one state
slot per sequence, and a token stream per request that is contiguous from its num_computed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from engine.config import EngineConfig
from engine.sampling_params import TokenLogprobs
from engine.worker.step import DoneStep, SamplerOutput, ScheduledSeq

EOS = 0


def fake_token(key: int, index: int, vocab_size: int) -> int:
    """Never EOS (0): tests that want a stop choose one of these tokens as a stop token."""
    h = (key * 0x9E3779B1 + index * 0x85EBCA77 + 0x27D4EB2F) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 0x2C1B3C6D) & 0xFFFFFFFF
    h ^= h >> 12
    return 1 + h % (vocab_size - 1)


def prompt_key(prompt: Sequence[int], seed: int | None) -> int:
    if seed is not None:
        return seed
    return hash(tuple(prompt[:8])) & 0xFFFFFFFF


def expected_tokens(
    prompt: Sequence[int], n: int, seed: int | None = None, vocab_size: int = 1000
) -> list[int]:
    key = prompt_key(prompt, seed)
    return [fake_token(key, i, vocab_size) for i in range(n)]


class FakeRunner:
    def __init__(
        self,
        num_kv_blocks: int = 64,
        num_state_slots: int = 9,
        block_size: int = 4,
        vocab_size: int = 1000,
        max_model_len: int = 4096,
        eos_token_ids: Sequence[int] = (EOS,),
        step_delay_s: float = 0.0,
        fail_at_step: int | None = None,
    ) -> None:
        self.num_kv_blocks = num_kv_blocks
        self.num_state_slots = num_state_slots
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.eos_token_ids = list(eos_token_ids)
        self.device_name = "fake"
        self.step_delay_s = step_delay_s
        self.fail_at_step = fail_at_step
        self.steps = 0
        self.batches: list[list[ScheduledSeq]] = []
        self._cache: dict[str, list[int]] = {}  # tokens "in the KV cache" per request
        self.keep_batches = False
        self.launched_ahead = 0  # steps launched before the previous step's tokens were read
        self.ahead: list[list[ScheduledSeq]] = []  # those steps' sequences

    def device_memory(self) -> tuple[int, int]:
        return (1000, 2000)

    def launch(self, seqs: list[ScheduledSeq], prev: DoneStep | None = None) -> DoneStep:
        """As the real runner's: rows scheduled ahead take the token ``prev`` sampled in their row
        (the fake runs at launch, so ``prev`` is already done)."""
        if any(s.prev_row >= 0 for s in seqs):
            assert prev is not None, "a step scheduled ahead without the previous launch"
            ids = prev.result().token_ids
            seqs = [replace(s, token_ids=(ids[s.prev_row],)) if s.prev_row >= 0 else s for s in seqs]
        if prev is not None:
            self.launched_ahead += 1
            self.ahead.append(seqs)
        return DoneStep(self.execute_model(seqs))

    def execute_model(self, seqs: list[ScheduledSeq]) -> SamplerOutput:
        self.steps += 1
        if self.fail_at_step is not None and self.steps >= self.fail_at_step:
            raise RuntimeError("injected runner failure")
        if self.keep_batches:
            self.batches.append(seqs)
        seen_prefill = False
        slots = set()
        tokens: list[int] = []
        logprobs: list[TokenLogprobs | None] = []
        for s in seqs:
            is_decode = len(s.token_ids) == 1 and s.num_computed > 0
            assert not (is_decode and seen_prefill), "decode after a prefill"
            seen_prefill |= not is_decode
            assert s.state_slot >= 1 and s.state_slot not in slots, "bad or shared state slot"
            slots.add(s.state_slot)
            assert 0 not in s.block_ids, "null block in a block table"
            assert len(s.block_ids) * self.block_size >= s.num_computed + len(s.token_ids)
            if s.num_computed == 0:
                self._cache[s.request_id] = []
            cache = self._cache[s.request_id]
            assert len(cache) == s.num_computed, f"{s.request_id}: cache {len(cache)} != {s.num_computed}"
            cache.extend(s.token_ids)
            if s.sample:
                key = prompt_key(cache[: len(cache) - s.num_output], s.params.seed)
                tok = fake_token(key, s.num_output, self.vocab_size)
                tokens.append(tok)
                k = s.params.logprobs
                logprobs.append(None if k is None else TokenLogprobs(tok, -0.5, [(tok, -0.5)] * k))
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        return SamplerOutput(tokens, logprobs)


def make(config: EngineConfig) -> FakeRunner:
    """Runner factory for the spawned engine process (importable by path)."""
    return FakeRunner(
        num_kv_blocks=config.cache.num_gpu_blocks_override or 256,
        num_state_slots=config.scheduler.max_num_seqs + 1,
        block_size=config.cache.block_size,
        max_model_len=config.model.max_model_len or 4096,
    )


def make_slow(config: EngineConfig) -> FakeRunner:
    runner = make(config)
    runner.step_delay_s = 0.02
    return runner


class CharTokenizer:
    """Tiny test tokenizer: id t -> one letter; 0 is the special EOS (skipped when asked)."""

    vocab_size = 1000
    eos_token_ids = [EOS]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        kept = [t for t in ids if not (skip_special_tokens and t == EOS)]
        return "".join("<eos>" if t == EOS else chr(97 + t % 26) for t in kept)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) - 97 + 26 for c in text]
