"""Tokenizer, sandboxed chat template and incremental detokenizer for HF-layout checkpoints.

Tokenization goes through the ``tokenizers`` library and the checkpoint's own ``tokenizer.json`` so
ids match HF exactly. Chat templates are untrusted input (a checkpoint can ship any Jinja), so they
render in Jinja's immutable sandbox with bounded output size and a render deadline.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

MAX_TEMPLATE_OUTPUT = 1 << 20  # characters; a prompt beyond this is an attack or a bug
TEMPLATE_TIME_LIMIT_S = 2.0
# Text this long is tokenized with the GIL released (Tokenizer.encode), and off the event loop
# (engine/frontend/input_processor.py): ~0.8 ms of tokenizer work on a 2-core AMD EPYC. With the
# old 16 KiB line a flood of abandoned 3 KB prompts kept the loop tokenizing and /health took 5 s.
GIL_FREE_CHARS = 1024
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "tools", "add_generation_prompt"})


class ChatTemplateError(ValueError):
    """The chat template is missing, malformed, or failed/aborted while rendering."""


def _short(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return msg[:200]


class _Budget(threading.local):
    deadline: float = 0.0


class _ChatTemplateEnv(ImmutableSandboxedEnvironment):
    """Sandbox that also enforces a deadline and a size bound on intermediate values.

    Output size is checked while streaming, but loops can also burn time or build huge strings
    without emitting anything, so the hooks every attribute access, call and arithmetic operator
    goes through check the deadline and the size of what they produce.
    """

    intercepted_binops = frozenset({"+", "*", "**"})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        self.budget = _Budget()

    def check(self, value: Any = None) -> Any:
        if time.monotonic() > self.budget.deadline:
            raise ChatTemplateError("chat template render exceeded its time limit")
        if isinstance(value, (str, list, tuple)) and len(value) > MAX_TEMPLATE_OUTPUT:
            raise ChatTemplateError("chat template produced an oversized value")
        return value

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self.check()
        if operator == "**" and isinstance(right, int) and abs(right) > 1024:
            raise ChatTemplateError("chat template exponent too large")
        if operator == "*":
            # Check before multiplying: "x" * 10**12 would allocate before any later check.
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                    if len(seq) * max(n, 0) > MAX_TEMPLATE_OUTPUT:
                        raise ChatTemplateError("chat template produced an oversized value")
        return self.check(super().call_binop(context, operator, left, right))

    def getattr(self, obj: Any, attribute: str) -> Any:
        return self.check(super().getattr(obj, attribute))

    def getitem(self, obj: Any, argument: Any) -> Any:
        return self.check(super().getitem(obj, argument))

    def call(self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        self.check()
        return self.check(super().call(__context, __obj, *args, **kwargs))


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(str(message)[:200])


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # Same defaults as HF's tojson: unicode kept as is, no HTML escaping.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _token_text(tok: Any) -> str | None:
    # tokenizer_config.json stores special tokens either as strings or as AddedToken dicts.
    if isinstance(tok, str):
        return tok
    if isinstance(tok, Mapping) and isinstance(tok.get("content"), str):
        return tok["content"]
    return None


def _eos_ids(value: Any) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool))
    return ()


class Tokenizer:
    """A checkpoint's tokenizer: ids via ``tokenizers``, prompts via its chat template."""

    def __init__(
        self,
        hf_tokenizer: HFTokenizer,
        chat_template: str | None = None,
        special_tokens: Mapping[str, str | None] | None = None,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        self._tok = hf_tokenizer
        self.chat_template = chat_template
        self.special_tokens: dict[str, str | None] = dict(special_tokens or {})
        self.eos_token_ids: tuple[int, ...] = tuple(eos_token_ids)
        self._env = _ChatTemplateEnv()
        self._env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        self._env.filters["tojson"] = _tojson
        self._template: jinja2.Template | None = None
        if chat_template is not None:
            try:
                self._template = self._env.from_string(chat_template)
            except jinja2.TemplateError as exc:
                raise ChatTemplateError(f"invalid chat template: {_short(exc)}") from None
        self._special_ids = frozenset(
            i for i, t in self._tok.get_added_tokens_decoder().items() if getattr(t, "special", False)
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        root = Path(path)
        tok_file = root / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {root}")
        hf = HFTokenizer.from_file(str(tok_file))
        tcfg = _read_json(root / "tokenizer_config.json")
        jinja_file = root / "chat_template.jinja"
        template = (
            jinja_file.read_text(encoding="utf-8") if jinja_file.is_file() else tcfg.get("chat_template")
        )
        if isinstance(template, list):  # HF allows a list of named templates; take "default"
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
            template = named.get("default")
        specials = {k: _token_text(tcfg.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        eos = _eos_ids(_read_json(root / "generation_config.json").get("eos_token_id"))
        if not eos:
            cfg = _read_json(root / "config.json")
            eos = _eos_ids(cfg.get("eos_token_id"))
            if not eos and isinstance(cfg.get("text_config"), Mapping):
                eos = _eos_ids(cfg["text_config"].get("eos_token_id"))
        if not eos and specials["eos_token"] is not None:
            tid = hf.token_to_id(specials["eos_token"])
            eos = (tid,) if tid is not None else ()
        return cls(hf, template if isinstance(template, str) else None, specials, eos)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def all_special_ids(self) -> frozenset[int]:
        return self._special_ids

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``. From GIL_FREE_CHARS on through ``encode_batch``, which releases the
        GIL while the Rust tokenizer works (``encode`` holds it): called from a worker thread, a long
        prompt then leaves the event loop free to answer other requests, /health included."""
        if len(text) >= GIL_FREE_CHARS:
            return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        /,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        # ``messages`` is positional-only so a client-supplied kwargs dict naming it lands here and
        # is rejected instead of raising TypeError; tools/add_generation_prompt are real parameters.
        if self._template is None:
            raise ChatTemplateError("this model has no chat template")
        clash = RESERVED_TEMPLATE_KWARGS.intersection(template_kwargs)
        if clash:
            raise ChatTemplateError(f"reserved chat template argument: {sorted(clash)[0]}")
        if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
            raise ChatTemplateError("messages must be a list of objects")
        context: dict[str, Any] = {k: v for k, v in self.special_tokens.items() if v is not None}
        context.update(template_kwargs)
        context.update(
            messages=[_normalize_message(m) for m in messages],
            tools=tools,
            add_generation_prompt=add_generation_prompt,
        )
        self._env.budget.deadline = time.monotonic() + TEMPLATE_TIME_LIMIT_S
        parts: list[str] = []
        size = 0
        try:
            for chunk in self._template.generate(**context):
                size += len(chunk)
                if size > MAX_TEMPLATE_OUTPUT:
                    raise ChatTemplateError("rendered chat template exceeds the size limit")
                self._env.check()
                parts.append(chunk)
        except ChatTemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
            raise ChatTemplateError(f"chat template error: {_short(exc)}") from None
        except (RecursionError, MemoryError, OverflowError, ZeroDivisionError) as exc:
            raise ChatTemplateError(f"chat template error: {type(exc).__name__}") from None
        return "".join(parts)


def _normalize_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI sends tool-call arguments as a JSON string; templates iterate them as a mapping."""
    msg = dict(message)
    calls = msg.get("tool_calls")
    if isinstance(calls, list):
        fixed = []
        for call in calls:
            if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
                fn = dict(call["function"])
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except json.JSONDecodeError:
                        pass  # leave it: the template decides what a non-object means
                call = {**call, "function": fn}
            fixed.append(call)
        msg["tool_calls"] = fixed
    return msg


class SupportsDecode(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Streams text for a growing token sequence without ever splitting a UTF-8 character.

    Works over any tokenizer with ``decode(ids, skip_special_tokens=...)`` (a :class:`Tokenizer`,
    or a test stand-in).

    Keeps two offsets into the ids: ``prefix`` starts a short window of already-emitted tokens
    that gives the decoder context, ``read`` ends it. Each step decodes only ``ids[prefix:]`` and
    emits what lies beyond the decoded window. A result ending in U+FFFD means the last token ends
    inside a multi-byte character, so it is held until a later token completes it. Work per token
    is bounded by the window, not the sequence length; ``MAX_PENDING`` caps how long we wait.
    """

    MAX_PENDING = 24  # tokens; past this the bytes will not form a character, emit them as U+FFFD

    def __init__(self, tokenizer: SupportsDecode, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self._parts: list[str] = []

    @property
    def token_ids(self) -> list[int]:
        return self._ids

    @property
    def text(self) -> str:
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=self._skip)

    def _step(self, force: bool) -> str:
        if self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._prefix, self._read)
        full = self._decode(self._prefix, len(self._ids))
        if full.endswith("\ufffd") and not force and len(self._ids) - self._read < self.MAX_PENDING:
            return ""
        delta = full[len(prefix_text) :]
        self._prefix, self._read = self._read, len(self._ids)
        if delta:
            self._parts.append(delta)
        return delta

    def add(self, ids: Sequence[int]) -> str:
        self._ids.extend(ids)
        return self._step(force=False)

    def flush(self) -> str:
        return self._step(force=True)
