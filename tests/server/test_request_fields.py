"""No request field is accepted and ignored: each one is in server/request_fields.py's table, handled
fields are read by the server code, and refused fields get a 400 naming them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from server import protocol
from server.request_fields import HANDLED, REFUSED
from tests.server.conftest import assert_openai_error

MODELS: list[type[BaseModel]] = [
    protocol.CompletionRequest,
    protocol.ChatCompletionRequest,
    protocol.TokenizeRequest,
    protocol.DetokenizeRequest,
]
SERVER = Path(protocol.__file__).parent
# A value that asks for what each refused field offers (the neutral default is accepted).
ASKING = {
    "response_format": {"type": "json_object"},
    "include_stop_str_in_output": True,
    "allowed_token_ids": [1, 2],
    "use_beam_search": True,
    "truncate_prompt_tokens": 8,
    "guided_json": {"type": "object"},
    "guided_regex": "a+",
    "guided_choice": ["a", "b"],
    "guided_grammar": "root ::= 'a'",
    "structured_outputs": {"json": {}},
    "tool_choice": "required",
    "continue_final_message": True,
    "echo": True,
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "documents": [{"text": "x"}],
}
ROUTE = {"CompletionRequest": "/v1/completions", "ChatCompletionRequest": "/v1/chat/completions"}
BASE = {
    "CompletionRequest": {"prompt": "Hello", "max_tokens": 2},
    "ChatCompletionRequest": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
}


def _server_source() -> str:
    return "\n".join(p.read_text() for p in SERVER.rglob("*.py") if p.name != "request_fields.py")


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_field_is_handled_or_refused(model: type[BaseModel]) -> None:
    name = model.__name__
    handled, refused = HANDLED[name], REFUSED[name]
    fields = set(model.model_fields)
    missing = fields - set(handled) - set(refused)
    assert not missing, f"{name} accepts {sorted(missing)} with no effect and no refusal"
    assert not (set(handled) | set(refused)) - fields, "the table names fields the model no longer has"
    source = _server_source()
    for field in handled:
        # A handled field must be read somewhere (body.<field>, a validator, by name); its own
        # declaration does not count.
        text = re.sub(rf"(?m)^\s+{field}\s*:.*$", "", source)
        assert re.search(rf"\.{field}\b|\"{field}\"", text), f"{name}.{field} is never read"


@pytest.mark.asyncio(loop_scope="module")
async def test_refused_fields_get_a_400_naming_them(client: httpx.AsyncClient) -> None:
    for model, fields in REFUSED.items():
        for field in fields:
            assert field in ASKING, f"no test value for refused field {field}"
            body: dict[str, Any] = {**BASE[model], field: ASKING[field]}
            resp = await client.post(ROUTE[model], json=body)
            assert_openai_error(resp, 400, field)
    # The neutral values of refused fields are accepted.
    ok = {
        **BASE["ChatCompletionRequest"],
        "response_format": {"type": "text"},
        "continue_final_message": False,
    }
    assert (await client.post("/v1/chat/completions", json=ok)).status_code == 200
