"""pretokenize: exact lengths, determinism, vLLM's natural-mode filter, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadgen.__main__ import main
from loadgen.dataset import (
    DatasetError,
    is_valid_sequence,
    iter_json_array,
    load_tokenizer,
    pretokenize,
    read_jsonl,
)

SAMPLE = Path(__file__).resolve().parents[2] / "loadgen" / "data" / "sample_sharegpt.json"


def _write(tmp_path: Path, obj: object, name: str = "d.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(obj), encoding="utf-8")
    return p


def _conv(i: int, *turns: str) -> dict:
    who = ["human", "gpt"]
    return {"id": f"c{i}", "conversations": [{"from": who[k % 2], "value": t} for k, t in enumerate(turns)]}


def test_sample_is_valid_sharegpt() -> None:
    data = json.loads(SAMPLE.read_text(encoding="utf-8"))
    assert len(data) >= 30
    assert any(len(c["conversations"]) > 2 for c in data)  # some multi-turn
    for c in data:
        assert c["conversations"][0]["from"] == "human"


@pytest.mark.parametrize("input_len,output_len", [(64, 16), (7, 3), (300, 128)])
def test_fixed_lengths_exact(tiny_checkpoint: Path, input_len: int, output_len: int) -> None:
    recs = pretokenize(SAMPLE, tiny_checkpoint, 20, seed=1, input_len=input_len, output_len=output_len)
    assert len(recs) == 20
    assert all(len(r["prompt_token_ids"]) == input_len for r in recs)
    assert all(r["output_len"] == output_len for r in recs)
    assert len({r["id"] for r in recs}) == 20


def test_fixed_extends_with_following_turns_and_conversations(tiny_checkpoint: Path, tmp_path: Path) -> None:
    tok = load_tokenizer(tiny_checkpoint)
    p = _write(tmp_path, [_conv(0, "the quick", "brown fox"), _conv(1, "lazy dog")])
    recs = pretokenize(p, tiny_checkpoint, 2, seed=0, input_len=40, output_len=4)
    text = tok.decode(recs[0]["prompt_token_ids"])
    # Both conversations' turns appear, joined, and the walk wraps around to reach 40 tokens.
    assert "the quick" in text and "brown fox" in text and "lazy dog" in text
    assert all(len(r["prompt_token_ids"]) == 40 for r in recs)


def test_more_prompts_than_entries_oversamples_with_unique_ids(tiny_checkpoint: Path) -> None:
    recs = pretokenize(SAMPLE, tiny_checkpoint, 50, seed=0, input_len=16, output_len=4)
    assert len(recs) == 50 and len({r["id"] for r in recs}) == 50


def test_same_seed_same_output_different_seed_differs(tiny_checkpoint: Path, tmp_path: Path) -> None:
    outs = []
    for seed, name in ((3, "a"), (3, "b"), (4, "c")):
        out = tmp_path / f"{name}.jsonl"
        args = ["pretokenize", "--dataset", str(SAMPLE), "--tokenizer", str(tiny_checkpoint)]
        args += ["-o", str(out), "--num-prompts", "16", "--input-len", "64", "--output-len", "16"]
        assert main(args + ["--seed", str(seed)]) == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]
    recs = read_jsonl(tmp_path / "a.jsonl")
    assert set(recs[0]) == {"id", "prompt_token_ids", "output_len"}


def test_vllm_filter_rules() -> None:
    assert is_valid_sequence(4, 4, False)
    assert not is_valid_sequence(3, 100, False)  # prompt too short
    assert not is_valid_sequence(100, 3, False)  # output too short
    assert is_valid_sequence(100, 3, True)  # ... unless the output length is fixed
    assert not is_valid_sequence(1025, 10, False)  # prompt too long
    assert is_valid_sequence(1024, 1024, False)
    assert not is_valid_sequence(1024, 1025, False)  # total too long


def test_natural_mode_filters_as_vllm(tiny_checkpoint: Path, tmp_path: Path) -> None:
    tok = load_tokenizer(tiny_checkpoint)
    long_reply = "the lazy dog " * 1000  # > 2048 tokens in total with any prompt
    data = [
        _conv(0, "hi", "a fine long enough reply here"),  # prompt < 4 tokens: dropped
        _conv(1, "what is the difference between a list", "ok"),  # reply < 4 tokens: dropped
        _conv(2, "the quick brown fox jumps over", long_reply),  # total > 2048: dropped
        _conv(3, "the quick brown fox jumps over the lazy dog", "a brown fox is quick"),  # kept
        _conv(4, "what is the difference between a list and the fox"),  # no reply: dropped
    ]
    p = _write(tmp_path, data)
    recs = pretokenize(p, tiny_checkpoint, 10, seed=0)
    assert [r["id"] for r in recs[:1]] == ["c3"]
    assert all(r["id"] == "c3" or r["id"].startswith("c3#") for r in recs)
    ids = tok.encode("the quick brown fox jumps over the lazy dog", add_special_tokens=False).ids
    assert recs[0]["prompt_token_ids"] == ids
    assert recs[0]["output_len"] == len(tok.encode("a brown fox is quick", add_special_tokens=False).ids)
    # With a fixed output length the replies' lengths no longer matter: only the short prompt goes.
    fixed = pretokenize(p, tiny_checkpoint, 4, seed=0, output_len=8)
    assert {r["id"] for r in fixed} == {"c1", "c2", "c3", "c4"}
    assert all(r["output_len"] == 8 for r in fixed)


def test_no_replies_needs_output_len(tiny_checkpoint: Path, tmp_path: Path) -> None:
    p = _write(tmp_path, [_conv(0, "the quick brown fox jumps"), _conv(1, "over the lazy dog again")])
    with pytest.raises(DatasetError, match="--output-len"):
        pretokenize(p, tiny_checkpoint, 2, seed=0)


def test_streaming_parser_across_chunk_boundaries(tmp_path: Path) -> None:
    data = [_conv(i, "é" * (i % 7) + "x" * i, "y\n" * i) for i in range(200)]
    p = tmp_path / "d.json"
    p.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    assert list(iter_json_array(p, chunk_chars=17)) == data
    assert list(iter_json_array(_write(tmp_path, [], "e.json"), chunk_chars=4)) == []


@pytest.mark.parametrize(
    "content,match",
    [
        ("", r"file is empty"),
        ("   \n", r"file is empty"),
        ('{"id": 1}', r"expected a JSON array"),
        ("[]", r"has no entries"),
        (
            '[{"id": "a", "conversations": []}, {"id": "b"}]',
            r"entry 1 \(id 'b'\): missing field 'conversations'",
        ),
        (
            '[{"id": "a", "conversations": [{"from": "human"}]}]',
            r"entry 0 \(id 'a'\): turn 0: missing field 'value'",
        ),
        ('[{"id": "a", "conversations": "hi"}]', r"'conversations' must be a list"),
        ("[1]", r"entry 0: expected an object"),
        ('[{"id": "a", "conversations": []}, {"id": ', r"entry 1: invalid JSON"),
        ('[{"id": "a", "conversations": []} {"id": "b"}]', r"after entry 0: expected ',' or ']'"),
        ('[{"id": "a", "conversations": []},', r"entry 1: file ends inside the top-level array"),
    ],
)
def test_malformed_files_give_clear_errors(
    tiny_checkpoint: Path, tmp_path: Path, content: str, match: str
) -> None:
    p = tmp_path / "bad.json"
    p.write_text(content, encoding="utf-8")
    with pytest.raises(DatasetError, match=match) as ei:
        pretokenize(p, tiny_checkpoint, 1, input_len=8, output_len=2)
    assert str(p) in str(ei.value)


def test_cli_reports_errors_without_traceback(tiny_checkpoint: Path, tmp_path: Path, capsys) -> None:
    p = tmp_path / "missing.json"
    rc = main(
        ["pretokenize", "--dataset", str(p), "--tokenizer", str(tiny_checkpoint), "-o", str(tmp_path / "o")]
        + ["--num-prompts", "1"]
    )
    assert rc == 2
    assert "no such file" in capsys.readouterr().err


def test_read_jsonl_checks_fields(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    p.write_text('{"id": "a", "prompt_token_ids": [1, 2], "output_len": 3}\n{"id": "b", "output_len": 3}\n')
    with pytest.raises(DatasetError, match=r"line 2: missing field 'prompt_token_ids'"):
        read_jsonl(p)
