"""A runner that emits a canned token sequence (then EOS) for every request: lets HTTP tests see exactly
what a Qwen3.5 model writes for reasoning and tool calls, through the real engine, server and parsers."""

from __future__ import annotations

from collections.abc import Sequence

from engine.worker.step import SamplerOutput, ScheduledSeq


class CannedRunner:
    def __init__(self, vocab_size: int, eos_token_id: int, max_model_len: int = 4096) -> None:
        self.num_kv_blocks = 600  # room for a whole max_model_len request with the tools prompt
        self.num_state_slots = 9
        self.block_size = 16
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.eos_token_ids = [eos_token_id]
        self.device_name = "canned"
        self.script: Sequence[int] = ()
        self.prompts: list[list[int]] = []
        """Every prompt prefilled, in order (tests read the rendered chat back from here)."""

    def execute_model(self, seqs: list[ScheduledSeq]) -> SamplerOutput:
        tokens = []
        for s in seqs:
            if s.num_computed == 0:
                self.prompts.append(list(s.history[: s.num_prompt]))
            if s.sample:
                i = s.num_output
                tokens.append(self.script[i] if i < len(self.script) else self.eos_token_ids[0])
        return SamplerOutput(tokens, [None] * len(tokens))
