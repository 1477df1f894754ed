"""Text -> token ids and every request rule, in one place.

The HTTP layer turns a body into prompts and SamplingParams through this class, and AsyncLLM runs
:meth:`InputProcessor.validate` on every :class:`PromptRequest` it admits, so each rule (empty prompt,
token ids inside the vocabulary, max_tokens bounds, the context length) has one owner and one message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.frontend.errors import ContextLengthError, InvalidRequestError
from engine.frontend.tokenizer import GIL_FREE_CHARS
from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class PromptRequest:
    """One sequence to generate: what AsyncLLM admits. The text-side options (stop strings, special
    tokens in the output text) ride here, not on SamplingParams: the engine never sees them."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    stop: tuple[str, ...] = ()
    skip_special_tokens: bool = True


class InputProcessor:
    def __init__(self, tokenizer: Any, vocab_size: int, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len

    # ---- text -> ids -----------------------------------------------------------------------------
    async def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        # Text longer than GIL_FREE_CHARS (one prompt, or a batch's total) is tokenized off the event loop,
        # with the GIL released, so neither a huge request nor a flood of long ones stalls the rest
        if len(text) > GIL_FREE_CHARS:
            return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens=add_special_tokens)
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    async def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """The model's chat template (sandboxed Jinja in the tokenizer) off the event loop, then ids.
        A template error (ChatTemplateError) propagates; bad template arguments name the kwargs."""
        from engine.frontend.tokenizer import ChatTemplateError

        try:
            text = await asyncio.to_thread(
                self.tokenizer.apply_chat_template,
                list(messages),
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                **(kwargs or {}),
            )
        except ChatTemplateError:
            raise
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError("chat_template_kwargs", "Chat template could not be rendered") from exc
        return await self.encode(text)

    async def prompt_ids(self, prompt: str | Sequence[int], param: str = "prompt") -> list[int]:
        """One prompt as checked token ids: text is encoded, ids are checked against the vocabulary."""
        ids = await self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self.check_prompt(ids, param)
        return ids

    async def batch_prompt_ids(
        self, prompts: Sequence[str | Sequence[int]], param: str = "prompt"
    ) -> list[list[int]]:
        """Every prompt of one request. The thread decision is on the batch's total text: 256 prompts of
        16 KB each stall the event loop as long as one 4 MB prompt."""
        texts = [p for p in prompts if isinstance(p, str)]
        if sum(len(t) for t in texts) > GIL_FREE_CHARS:
            encoded = await asyncio.to_thread(
                lambda: [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
            )
        else:
            encoded = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        it = iter(encoded)
        out = [next(it) if isinstance(p, str) else list(p) for p in prompts]
        for ids in out:
            self.check_prompt(ids, param)
        return out

    # ---- the rules -------------------------------------------------------------------------------
    def check_token_ids(self, ids: Sequence[int], param: str) -> None:
        vocab = self.vocab_size
        for t in ids:
            if type(t) is not int or not 0 <= t < vocab:
                raise InvalidRequestError(param, f"{param} contains a token id outside [0, {vocab})")

    def check_prompt(self, ids: Sequence[int], param: str = "prompt") -> None:
        if len(ids) == 0:
            raise InvalidRequestError(param, f"{param} must not be empty")
        self.check_token_ids(ids, param)

    def check_max_tokens(self, requested: int | None, param: str = "max_tokens") -> None:
        """A bound that needs no prompt: no request may ask for more tokens than the context holds."""
        if requested is not None and requested > self.max_model_len:
            raise InvalidRequestError("max_tokens", f"{param} must be at most {self.max_model_len}")

    def resolve_max_tokens(self, requested: int | None, prompt_len: int) -> int:
        """Absent: whatever room the context leaves (as vLLM), at least 1 so that an over-long prompt
        still fails the context check."""
        max_tokens = requested if requested is not None else max(1, self.max_model_len - prompt_len)
        self.check_context(prompt_len, max_tokens)
        return max_tokens

    def check_context(self, prompt_len: int, max_tokens: int) -> None:
        if prompt_len + max_tokens > self.max_model_len:
            raise ContextLengthError(prompt_len, max_tokens, self.max_model_len)

    def validate(self, req: PromptRequest) -> None:
        """Everything a request must satisfy before the engine sees it (AsyncLLM calls it on admission)."""
        p = req.params
        self.check_prompt(req.prompt_token_ids, "prompt")
        self.check_token_ids(p.stop_token_ids, "stop_token_ids")
        # 0 only when the prompt is scored (echo / prompt_logprobs): nothing is generated then.
        if p.max_tokens < (0 if p.prompt_logprobs is not None else 1):
            raise InvalidRequestError("max_tokens", "max_tokens must be at least 1")
        if p.min_tokens > p.max_tokens:
            raise InvalidRequestError("min_tokens", "min_tokens must not exceed max_tokens")
        self.check_context(len(req.prompt_token_ids), p.max_tokens)
