"""Reasoning parsers: split a chat completion's text into ``reasoning_content`` and ``content``.

``qwen3``: Qwen3 / Qwen3.5 reason between ``<think>`` and ``</think>``. Qwen3.5's template opens the
block in the prompt (``<|im_start|>assistant\\n<think>\\n``), so the output starts inside the
reasoning and only ``</think>`` shows up; a model whose prompt did not open it may emit ``<think>``
itself first. A generation that stops before ``</think>`` is all reasoning. With
``enable_thinking=false`` the template closes an empty block in the prompt, so everything is content.

The parser is incremental (text in, deltas out) and holds back only a tail that could still be the
start of a tag; the non-streamed response runs the same parser over the same deltas, so the streamed
deltas always concatenate to the non-streamed message.
"""

from __future__ import annotations

START, END = "<think>", "</think>"
PARSERS = ("qwen3",)


def held_prefix(buf: str, tags: tuple[str, ...]) -> int:
    """Length of the longest tail of ``buf`` that is a proper prefix of one of ``tags``."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(buf)), best, -1):
            if buf.endswith(tag[:k]):
                best = k
                break
    return best


def prompt_opens_thinking(prompt_text: str) -> bool:
    """The rendered prompt ends inside an open ``<think>`` block."""
    return prompt_text.rfind(START) > prompt_text.rfind(END)


class Qwen3ReasoningParser:
    def __init__(self, in_reasoning: bool) -> None:
        self.in_reasoning = in_reasoning
        self._held = ""
        self._fresh = True  # nothing emitted yet: a leading <think> may still open the block
        self._strip_newlines = False  # right after </think> the template puts blank lines

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning delta, content delta) for the next piece of output text."""
        buf = self._held + text
        self._held = ""
        reasoning, content = [], []
        while buf:
            if self.in_reasoning:
                i = buf.find(END)
                if i < 0:
                    keep = held_prefix(buf, (END,))
                    reasoning.append(buf[: len(buf) - keep])
                    self._held = buf[len(buf) - keep :]
                    break
                reasoning.append(buf[:i])
                buf = buf[i + len(END) :]
                self.in_reasoning, self._fresh, self._strip_newlines = False, False, True
                continue
            if self._strip_newlines:
                stripped = buf.lstrip("\n")
                if not stripped:
                    break
                buf, self._strip_newlines = stripped, False
            if self._fresh:
                lead = buf.lstrip()
                if lead.startswith(START):
                    buf = lead[len(START) :]
                    self.in_reasoning, self._fresh = True, False
                    continue
                if START.startswith(lead):  # could still become <think>: wait for more
                    self._held = buf
                    break
            self._fresh = False
            content.append(buf)
            break
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        if self.in_reasoning:
            return held, ""
        return "", held.lstrip("\n") if self._strip_newlines else held


def make_reasoning_parser(name: str, prompt_text: str) -> Qwen3ReasoningParser:
    if name != "qwen3":
        raise ValueError(f"unknown reasoning parser {name!r}; known: {', '.join(PARSERS)}")
    return Qwen3ReasoningParser(in_reasoning=prompt_opens_thinking(prompt_text))
