"""Pydantic models of the OpenAI-compatible API: requests are bounded field by field; the fixed small
responses (models, tokenize, errors) are typed, while the routes build completion bodies as dicts.

Every numeric field has an upper bound here so that no request can ask for unbounded work; bounds that
depend on the model (vocab size, context length) are checked in the routes once the prompt is known.
"""

from __future__ import annotations

import re
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from server.text_checks import reject_surrogates

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_N = 16
MAX_LOGPROBS = 20
MAX_STOP = 16
MAX_STOP_LEN = 256
MAX_STOP_TOKEN_IDS = 64
MAX_PROMPTS = 256
MAX_MESSAGES = 4096
MAX_BAD_WORDS = 64
# Hard ceiling for token counts before the model's own max_model_len is known.
MAX_TOKENS_CAP = 1 << 24

TokenId = StrictInt
Prompt = str | list[TokenId] | list[str] | list[list[TokenId]]
StopStr = Annotated[str, Field(min_length=1, max_length=MAX_STOP_LEN)]
TemplateScalar = str | int | float | bool | None


class StreamOptions(BaseModel):
    # OpenAI keeps adding keys here (include_obfuscation, ...) and its SDKs send them: ignore, not 400.
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


# logit_bias keys are token ids written in ASCII decimal; str.isdigit() would also pass "²" or "٣".
_LOGIT_BIAS_KEY = re.compile(r"[0-9]{1,19}")


class _Request(BaseModel):
    """Fields shared by completions and chat (OpenAI names, vLLM extensions)."""

    # Clients send newer OpenAI fields all the time; unknown fields are ignored, not errors.
    # strict: true is not 1 and "3" is not 3, as in OpenAI's API (floats still take ints).
    model_config = ConfigDict(extra="ignore", strict=True)

    _no_surrogates = model_validator(mode="before")(reject_surrogates)

    model: str | None = Field(default=None, max_length=512)
    max_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS_CAP)
    """0 only with echo / prompt_logprobs (the prompt is scored, nothing generated)."""
    n: int = Field(default=1, ge=1, le=MAX_N)
    best_of: int | None = Field(default=None, ge=1, le=MAX_N)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(default=0, ge=-1, le=MAX_TOKENS_CAP)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    stop: StopStr | Annotated[list[StopStr], Field(max_length=MAX_STOP)] | None = None
    stop_token_ids: list[TokenId] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)]] | None = Field(
        default=None, max_length=1024
    )
    min_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS_CAP)
    ignore_eos: bool = False
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0, allow_inf_nan=False)
    bad_words: Annotated[list[StopStr], Field(max_length=MAX_BAD_WORDS)] | None = None
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # Declared so that they are refused by name (server/request_fields.py) rather than ignored.
    response_format: dict[str, Any] | None = None
    include_stop_str_in_output: bool = False
    allowed_token_ids: list[TokenId] | None = Field(default=None, max_length=1 << 16)
    use_beam_search: bool = False
    truncate_prompt_tokens: int | None = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=256)
    skip_special_tokens: bool = True

    @field_validator("logit_bias")
    @classmethod
    def _ascii_token_keys(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key in v or {}:
            if _LOGIT_BIAS_KEY.fullmatch(key) is None:
                raise ValueError("keys must be token ids written as ASCII decimal integers")
        return v

    @model_validator(mode="after")
    def _check_combinations(self) -> _Request:
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of must equal n (beam search and best-of sampling are not supported)")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Request):
    prompt: Prompt
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _bounded_batch(cls, v: Any) -> Any:
        if isinstance(v, list) and v and isinstance(v[0], str | list) and len(v) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts per request")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix is not supported")
        return v


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(default=None, max_length=256)
    tool_call_id: str | None = Field(default=None, max_length=256)
    tool_calls: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"content is required for a {self.role} message")
        return self

    def text(self) -> str | None:
        """Text parts joined by newlines, as vLLM flattens them for text-only templates."""
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content)

    def as_template_dict(self) -> dict[str, Any]:
        # "developer" is OpenAI's newer name for "system"; chat templates only know the latter (vLLM
        # maps it the same way).
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": self.text()}
        for key in ("name", "tool_call_id", "tool_calls", "reasoning_content"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_CAP)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    echo: bool = False
    functions: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    function_call: str | dict[str, Any] | None = None
    documents: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    chat_template_kwargs: dict[str, TemplateScalar] | None = Field(default=None, max_length=16)
    # Declared only so that it can be refused: templates come from the model directory, never a request.
    chat_template: Any = None

    @field_validator("chat_template")
    @classmethod
    def _no_template(cls, v: Any) -> Any:
        if v is not None:
            raise ValueError("chat_template in the request is not allowed")
        return v

    @field_validator("chat_template_kwargs")
    @classmethod
    def _kwarg_names(cls, v: dict[str, TemplateScalar] | None) -> dict[str, TemplateScalar] | None:
        reserved = {"messages", "tools", "add_generation_prompt", "tokenize", "chat_template", "documents"}
        for key in v or {}:
            if not key.isidentifier() or len(key) > 64 or key in reserved or key.startswith("_"):
                raise ValueError("chat_template_kwargs has a key that is not allowed")
        return v

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        return self

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    _no_surrogates = model_validator(mode="before")(reject_surrogates)
    model: str | None = Field(default=None, max_length=512)
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1, max_length=MAX_MESSAGES)
    add_special_tokens: bool = False
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, TemplateScalar] | None = Field(default=None, max_length=16)

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of prompt and messages is required")
        if self.chat_template_kwargs:
            ChatCompletionRequest._kwarg_names(self.chat_template_kwargs)
        return self


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    _no_surrogates = model_validator(mode="before")(reject_surrogates)
    model: str | None = Field(default=None, max_length=512)
    tokens: list[TokenId] = Field(max_length=1 << 20)


# Responses -----------------------------------------------------------------------------------------


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "deltaserve"
    root: str | None = None
    """The checkpoint the served name stands for (vLLM: the model path clients load a tokenizer from)."""
    parent: str | None = None
    """Set for adapters; a base model has none."""
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
