"""The request-wide lone-surrogate check (server/text_checks.py) and the token-id range check
(engine/frontend/input_processor.py) on the shapes real bodies have: nested dicts and lists, prompt
batches, long lists of token ids (the fast paths), and the values each must refuse."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine.frontend.errors import InvalidRequestError
from engine.frontend.input_processor import InputProcessor
from server.protocol import ChatCompletionRequest, CompletionRequest
from server.text_checks import find_surrogate

LONE = "\ud800"


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ("plain", None),
        (LONE, "body"),
        ({"prompt": list(range(4096))}, None),  # token ids: one type scan, no paths
        ({"prompt": [1, 2.5, True, None]}, None),
        ({"prompt": ["ok", "fine" + LONE]}, "prompt[1]"),
        ({"prompt": [[1, 2], [3, "x" + LONE]]}, "prompt[1][1]"),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": LONE}]},
            "messages[1].content",
        ),
        ({"a": {"b": {"c": [0, {"d": LONE}]}}}, "a.b.c[1].d"),
        ({"k" + LONE: 1}, "body"),
        ({"outer": {"k" + LONE: 1}}, "outer"),
        ({"ok": "é日本", "list": ["é", 3, ("tuple", LONE)]}, "list[2][1]"),
    ],
)
def test_find_surrogate_names_the_first_offender(body, where) -> None:
    assert find_surrogate(body) == where


def test_request_models_refuse_a_surrogate_anywhere_and_accept_long_token_prompts() -> None:
    ids = list(range(1, 2049))
    assert CompletionRequest.model_validate({"prompt": ids}).prompt == ids
    with pytest.raises(ValidationError, match=r"prompt\[2\] contains a lone UTF-16 surrogate"):
        CompletionRequest.model_validate({"prompt": ["a", "b", LONE]})
    with pytest.raises(ValidationError, match=r"stop\[0\] contains a lone"):
        CompletionRequest.model_validate({"prompt": ids, "stop": [LONE]})
    with pytest.raises(ValidationError, match=r"messages\[0\].content contains a lone"):
        ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": LONE}]})


def test_token_ids_outside_the_vocabulary_are_refused_by_name() -> None:
    ip = InputProcessor(tokenizer=None, vocab_size=100, max_model_len=4096)
    ip.check_token_ids(list(range(100)), "prompt")
    ip.check_token_ids([], "prompt")
    for bad in ([0, 100], [-1, 5], [5, True], [3.0], [1, "2"]):
        with pytest.raises(InvalidRequestError, match=r"prompt contains a token id outside \[0, 100\)"):
            ip.check_token_ids(bad, "prompt")
    with pytest.raises(InvalidRequestError, match="prompt must not be empty"):
        ip.check_prompt([])
