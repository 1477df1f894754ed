"""Every field the request models accept, and what happens to it: handled, or refused by name.

Nothing is accepted and silently ignored. ``HANDLED`` fields take effect (the value says where);
``REFUSED`` fields are accepted by the schema only so that a request using them gets a 400 naming the
field instead of a 200 that ignored it; each maps to the predicate that says the value asks for
something deltaserve does not do (the neutral default passes). tests/server/test_request_fields.py
checks this table against the models' fields.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from server.errors import APIError

_COMMON_HANDLED = {
    "model": "check_model: 404 for another name",
    "max_tokens": "SamplingParams.max_tokens (0 with echo / prompt_logprobs: score only)",
    "n": "n samples per prompt, one wave",
    "best_of": "validated equal to n",
    "temperature": "sampler", "top_p": "sampler", "top_k": "sampler", "min_p": "sampler",
    "seed": "per-request sampling seed",
    "stop": "stop strings (AsyncLLM)", "stop_token_ids": "scheduler stop tokens",
    "logit_bias": "sampler (engine/penalties.py)",
    "min_tokens": "stop tokens banned until reached",
    "ignore_eos": "scheduler",
    "presence_penalty": "sampler", "frequency_penalty": "sampler", "repetition_penalty": "sampler",
    "bad_words": "tokenized, banned in the sampler",
    "prompt_logprobs": "scored in the prefill; vLLM's prompt_logprobs in the response",
    "stream": "SSE", "stream_options": "include_usage",
    "user": "logged with the request",
    "skip_special_tokens": "detokenizer",
}  # fmt: skip


def _set(v: Any) -> bool:
    return v is not None


def _true(v: Any) -> bool:
    return v is True


def _not_text_format(v: Any) -> bool:
    return v is not None and v.get("type") != "text"


def _forced_tool_choice(v: Any) -> bool:
    return v == "required" or isinstance(v, dict)


_COMMON_REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "response_format": (_not_text_format, "response_format other than text needs structured output"),
    "include_stop_str_in_output": (_true, "include_stop_str_in_output is not supported"),
    "allowed_token_ids": (_set, "allowed_token_ids is not supported"),
    "use_beam_search": (_true, "beam search is not supported"),
    "truncate_prompt_tokens": (_set, "truncate_prompt_tokens is not supported"),
    "guided_json": (_set, "guided decoding is not supported"),
    "guided_regex": (_set, "guided decoding is not supported"),
    "guided_choice": (_set, "guided decoding is not supported"),
    "guided_grammar": (_set, "guided decoding is not supported"),
    "structured_outputs": (_set, "structured outputs are not supported"),
}

HANDLED: dict[str, dict[str, str]] = {
    "CompletionRequest": {
        **_COMMON_HANDLED,
        "prompt": "tokenized (or token ids), one wave",
        "echo": "prompt text (and prompt logprobs) in front of the completion",
        "logprobs": "sampled-token logprobs; with echo, the prompt's too",
        "suffix": "refused by its validator unless empty",
    },
    "ChatCompletionRequest": {
        **_COMMON_HANDLED,
        "messages": "chat template",
        "max_completion_tokens": "output limit",
        "logprobs": "sampled-token logprobs",
        "top_logprobs": "alternatives per token",
        "tools": "chat template, tool-call parser",
        "tool_choice": "none: no parsing; auto: parsed (needs --enable-auto-tool-choice)",
        "parallel_tool_calls": "false keeps the first call only",
        "add_generation_prompt": "chat template",
        "chat_template_kwargs": "chat template (enable_thinking, ...)",
        "chat_template": "refused by its validator unless absent",
    },
    "TokenizeRequest": {
        "model": "check_model",
        "prompt": "tokenized",
        "messages": "chat template",
        "add_special_tokens": "tokenizer",
        "add_generation_prompt": "chat template",
        "chat_template_kwargs": "chat template",
    },  # fmt: skip
    "DetokenizeRequest": {"model": "check_model", "tokens": "decoded"},
}

REFUSED: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "CompletionRequest": dict(_COMMON_REFUSED),
    "ChatCompletionRequest": {
        **_COMMON_REFUSED,
        "tool_choice": (
            _forced_tool_choice,
            "tool_choice 'required' or a named function needs structured output",
        ),
        "continue_final_message": (_true, "continue_final_message is not supported"),
        "echo": (_true, "echo is not supported for chat completions"),
        "functions": (_set, "functions is deprecated: send tools"),
        "function_call": (_set, "function_call is deprecated: send tool_choice"),
        "documents": (_set, "documents is not supported"),
    },
    "TokenizeRequest": {},
    "DetokenizeRequest": {},
}


def refuse_unsupported(body: BaseModel) -> None:
    """400 naming the first field whose value asks for something unsupported."""
    for name, (refused, message) in REFUSED.get(type(body).__name__, {}).items():
        if refused(getattr(body, name)):
            raise APIError(400, message, param=name)
