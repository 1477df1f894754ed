"""ShareGPT loading and pretokenization.

The ShareGPT dump is ~600 MB, so the file is read through a small streaming parser for the
top-level JSON array and only the fields a mode needs are kept. The tokenizer is loaded from the
checkpoint's ``tokenizer.json`` with the ``tokenizers`` library directly, so loadgen does not
depend on the engine package.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .jsonstream import DatasetError, iter_json_array

# vLLM's ShareGPT pruning rules (benchmarks/datasets.py ``is_valid_sequence``).
MIN_LEN = 4
MAX_PROMPT_LEN = 1024
MAX_TOTAL_LEN = 2048
# Separator placed between joined turns when a fixed-length prompt is extended.
JOIN_SEPARATOR = "\n\n"


@dataclass
class Conversation:
    id: str
    turns: list[tuple[str, str]]  # (from, value), in order

    def first_human(self) -> tuple[int, str] | None:
        for i, (who, text) in enumerate(self.turns):
            if who in ("human", "user"):
                return i, text
        return None


def parse_conversation(path: Path, index: int, obj: Any) -> Conversation:
    """Check one ShareGPT entry and return it; raise DatasetError naming what is wrong."""
    where = f"{path}: entry {index}"
    if not isinstance(obj, dict):
        raise DatasetError(f"{where}: expected an object, got {type(obj).__name__}")
    if "id" in obj:
        where += f" (id {obj['id']!r})"
    if "conversations" not in obj:
        raise DatasetError(f"{where}: missing field 'conversations'")
    convs = obj["conversations"]
    if not isinstance(convs, list):
        raise DatasetError(f"{where}: 'conversations' must be a list, got {type(convs).__name__}")
    turns: list[tuple[str, str]] = []
    for j, turn in enumerate(convs):
        if not isinstance(turn, dict):
            raise DatasetError(f"{where}: turn {j}: expected an object, got {type(turn).__name__}")
        for field in ("from", "value"):
            if field not in turn:
                raise DatasetError(f"{where}: turn {j}: missing field '{field}'")
        if not isinstance(turn["value"], str):
            raise DatasetError(f"{where}: turn {j}: 'value' must be a string")
        turns.append((str(turn["from"]), turn["value"]))
    return Conversation(id=str(obj.get("id", index)), turns=turns)


def load_conversations(path: Path, keep_all_turns: bool) -> list[Conversation]:
    """Stream the file; keep every turn only when a mode needs them (prompt extension)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    out: list[Conversation] = []
    for i, obj in enumerate(iter_json_array(path)):
        conv = parse_conversation(path, i, obj)
        if not keep_all_turns:
            first = conv.first_human()
            # Natural mode only needs the first human turn and the reply after it.
            conv.turns = conv.turns[first[0] : first[0] + 2] if first else []
        out.append(conv)
    if not out:
        raise DatasetError(f"{path}: the dataset has no entries")
    return out


def load_tokenizer(checkpoint: Path) -> Any:
    """A ``tokenizers.Tokenizer`` from a checkpoint directory (or a tokenizer.json path)."""
    from tokenizers import Tokenizer

    p = Path(checkpoint)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise DatasetError(f"{p}: no tokenizer.json found")
    return Tokenizer.from_file(str(file))


def _encode(tok: Any, text: str) -> list[int]:
    # Raw prompt ids with no special tokens, as vLLM's sampler tokenizes ShareGPT prompts.
    return list(tok.encode(text, add_special_tokens=False).ids)


def is_valid_sequence(prompt_len: int, output_len: int, skip_min_output_len_check: bool) -> bool:
    """vLLM's ShareGPT filter: too-short prompts/outputs and too-long prompts/totals are dropped."""
    if prompt_len < MIN_LEN or prompt_len > MAX_PROMPT_LEN:
        return False
    if not skip_min_output_len_check and output_len < MIN_LEN:
        return False
    return prompt_len + output_len <= MAX_TOTAL_LEN


def sample_natural(convs: list[Conversation], tok: Any, num: int, output_len: int | None) -> list[dict]:
    """Prompts at their natural length; output_len from the reply unless fixed."""
    out: list[dict] = []
    no_reply = 0
    for conv in convs:
        if len(out) >= num:
            break
        first = conv.first_human()
        if first is None:
            continue
        i, text = first
        reply = conv.turns[i + 1][1] if i + 1 < len(conv.turns) else None
        if reply is None and output_len is None:
            no_reply += 1
            continue
        ids = _encode(tok, text)
        n_out = output_len if output_len is not None else len(_encode(tok, reply or ""))
        if not is_valid_sequence(len(ids), n_out, skip_min_output_len_check=output_len is not None):
            continue
        out.append({"id": conv.id, "prompt_token_ids": ids, "output_len": n_out})
    if not out and no_reply:
        raise DatasetError(
            f"none of the {no_reply} conversations without a reply can give a natural output length: "
            "pass --output-len"
        )
    return out


def sample_fixed(
    convs: list[Conversation], tok: Any, num: int, input_len: int, output_len: int | None
) -> list[dict]:
    """Prompts of exactly input_len tokens: a prompt is cut, or extended with its own following
    turns and then the turns of the conversations after it (in shuffled order, wrapping)."""
    cache: dict[int, list[list[int]]] = {}

    def pieces(k: int) -> list[list[int]]:
        if k not in cache:
            conv = convs[k]
            first = conv.first_human()
            start = first[0] if first else 0
            cache[k] = [_encode(tok, t) for _, t in conv.turns[start:] if t]
        return cache[k]

    sep = _encode(tok, JOIN_SEPARATOR)
    out: list[dict] = []
    for k, conv in enumerate(convs):
        if len(out) >= num:
            break
        first = conv.first_human()
        if first is None or not first[1].strip():
            continue
        n_out = output_len
        if n_out is None:
            i = first[0]
            if i + 1 >= len(conv.turns):
                raise DatasetError(
                    f"entry id {conv.id!r} has no reply to take an output length from: pass --output-len"
                )
            n_out = len(_encode(tok, conv.turns[i + 1][1]))
        if not any(pieces(k)):
            continue
        ids: list[int] = []
        j = k
        # Terminates: conversation k itself has tokens, and the walk wraps around the dataset.
        while len(ids) < input_len:
            for p in pieces(j % len(convs)):
                ids.extend(sep + p if ids else p)
                if len(ids) >= input_len:
                    break
            j += 1
        out.append({"id": conv.id, "prompt_token_ids": ids[:input_len], "output_len": n_out})
    return out


def pretokenize(
    dataset: Path,
    checkpoint: Path,
    num_prompts: int,
    seed: int = 0,
    input_len: int | None = None,
    output_len: int | None = None,
) -> list[dict]:
    """Records {"id", "prompt_token_ids", "output_len"}, deterministic for a given seed."""
    if input_len is not None and input_len < 1:
        raise DatasetError("--input-len must be at least 1")
    if output_len is not None and output_len < 1:
        raise DatasetError("--output-len must be at least 1")
    tok = load_tokenizer(checkpoint)
    convs = load_conversations(Path(dataset), keep_all_turns=input_len is not None)
    random.Random(seed).shuffle(convs)  # seeded shuffle of the whole set, as vLLM does
    if input_len is None:
        records = sample_natural(convs, tok, num_prompts, output_len)
    else:
        records = sample_fixed(convs, tok, num_prompts, input_len, output_len)
    if not records:
        raise DatasetError(f"{dataset}: no entry passed the length filters")
    if len(records) < num_prompts:
        # vLLM oversamples with a seeded choice; ids get a suffix so they stay unique.
        print(
            f"warning: only {len(records)} usable prompts for --num-prompts {num_prompts}; oversampling",
            file=sys.stderr,
        )
        rng = random.Random(seed + 1)
        base = list(records)
        for n in range(num_prompts - len(records)):
            extra = dict(rng.choice(base))
            extra["id"] = f"{extra['id']}#{n + 1}"
            records.append(extra)
    return records


def write_jsonl(records: list[dict], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    """Read a pretokenized file, checking each line so a bad file fails before any request."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    out: list[dict] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}: line {lineno}: invalid JSON: {e.msg}") from None
            for field in ("prompt_token_ids", "output_len"):
                if field not in rec:
                    raise DatasetError(f"{path}: line {lineno}: missing field '{field}'")
            ids = rec["prompt_token_ids"]
            if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
                raise DatasetError(f"{path}: line {lineno}: 'prompt_token_ids' must be a non-empty int list")
            if not isinstance(rec["output_len"], int) or rec["output_len"] < 1:
                raise DatasetError(f"{path}: line {lineno}: 'output_len' must be a positive integer")
            rec.setdefault("id", str(lineno))
            out.append(rec)
    if not out:
        raise DatasetError(f"{path}: no requests in file")
    return out
