"""``deltaserve`` command line: serve, generate, make-checkpoint.

Serve flags are generated from the frozen config dataclasses (field name with dashes; the field's
docstring is the help), so flags that mean the same as vLLM's carry vLLM's names.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import logging
import os
import sys
import typing
from typing import Any

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, ServerConfig
from engine.logs import LEVEL_ENV, LEVELS, configure_logging
from engine.worker.resolve import resolve_cache, resolve_model

SECTIONS = (ModelConfig, CacheConfig, SchedulerConfig, ServerConfig)


def _device(value: str) -> str:
    if value in ("auto", "cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit()):
        return value
    raise argparse.ArgumentTypeError(f"invalid device {value!r} (choose auto, cpu, cuda or cuda:N)")


def _byte_size(value: str) -> str:
    """A size flag (--kv-cache-memory, --device-memory-limit) checked at parse time; kept as written."""
    from engine.worker.memory import parse_bytes

    try:
        parse_bytes(value, "size")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("size: ")) from None
    return value


_SIZE_FLAGS = ("kv_cache_memory", "device_memory_limit")


def _profile_steps(value: str) -> str:
    """--profile-steps checked at parse time (START:COUNT or empty); kept as written."""
    from engine.worker.step_timeline import Window

    if value:
        try:
            Window.parse(value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix("--profile-steps: ")) from None
    return value


EXIT_PORT_BUSY = 2


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each flag's default (and argparse shows the choices)."""


def _field_docs(cls: type) -> dict[str, str]:
    """The string literal that follows each field in the class body."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for a, b in zip(body, body[1:], strict=False):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
            docs[a.target.id] = str(b.value.value)  # type: ignore[union-attr]
    return docs


def add_config_flags(p: argparse.ArgumentParser, sections: tuple[type, ...] = SECTIONS) -> None:
    for cls in sections:
        group = p.add_argument_group(cls.__name__)
        docs = _field_docs(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            flag = "--" + f.name.replace("_", "-")
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc,operator]
            kw: dict[str, Any] = {"dest": f.name, "default": default, "help": docs.get(f.name, "")}
            if isinstance(default, bool):
                kw["action"] = argparse.BooleanOptionalAction
            elif isinstance(default, tuple):
                kw["nargs"] = "*"
            elif f.name == "device":
                kw["type"] = _device
            elif f.name in _SIZE_FLAGS:
                kw["type"] = _byte_size
            elif f.name == "profile_steps":
                kw["type"] = _profile_steps
            else:
                kw["type"] = type(default)
                if typing.get_origin(hints[f.name]) is typing.Literal:
                    kw["choices"] = typing.get_args(hints[f.name])
            group.add_argument(flag, **kw)


def configs_from_args(ns: argparse.Namespace) -> tuple[EngineConfig, ServerConfig]:
    def build(cls: type) -> Any:
        vals = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if hasattr(ns, f.name)}
        vals = {k: tuple(v) if isinstance(v, list) else v for k, v in vals.items()}
        return cls(**vals)

    model = resolve_model(build(ModelConfig))
    cache = resolve_cache(build(CacheConfig), model.model)
    engine = EngineConfig(model=model, cache=cache, scheduler=build(SchedulerConfig))
    return engine, build(ServerConfig)


def _log_config(engine: EngineConfig, server: ServerConfig) -> None:
    shown = dataclasses.asdict(server)
    if shown.get("api_key"):
        shown["api_key"] = "<set>"
    logging.getLogger("deltaserve").info(
        "config: %s", json.dumps({"engine": dataclasses.asdict(engine), "server": shown})
    )


def cmd_serve(ns: argparse.Namespace) -> int:
    from server.listen import PortInUseError, bind_socket

    try:  # before resolving the model: that imports torch and may write the tiny checkpoint
        sock = bind_socket(ns.host, ns.port)
    except PortInUseError as e:
        logging.getLogger("deltaserve").error(str(e))
        return EXIT_PORT_BUSY
    engine, server = configs_from_args(ns)
    _log_config(engine, server)
    from server.launch import run_server

    return run_server(engine, server, log_level=ns.log_level, sock=sock) or 0


def cmd_generate(ns: argparse.Namespace) -> int:
    from engine.frontend.tokenizer import Tokenizer
    from engine.generate import generate
    from engine.sampling_params import SamplingParams
    from engine.worker.model_runner import ModelRunner

    engine, _ = configs_from_args(ns)
    runner = ModelRunner(engine)
    tok = Tokenizer.from_dir(engine.model.model)
    prompts = [tok.encode(p) for p in ns.prompt]
    params = SamplingParams(max_tokens=ns.max_tokens, temperature=ns.temperature, seed=ns.sample_seed)
    budget = engine.scheduler.max_num_batched_tokens
    outs = generate(
        runner, prompts, ns.max_tokens, params, token_budget=budget, stop_at_eos=not ns.ignore_eos
    )
    for p, o in zip(ns.prompt, outs, strict=False):
        print(json.dumps({"prompt": p, "token_ids": o, "text": tok.decode(o, skip_special_tokens=True)}))
    return 0


def cmd_make_checkpoint(ns: argparse.Namespace) -> int:
    from engine.checkpoints.presets import make_checkpoint

    path = make_checkpoint(ns.dir, preset=ns.preset, seed=ns.seed, dtype=ns.dtype)
    print(path)
    return 0


def parser() -> argparse.ArgumentParser:
    # --log-level works before or after the subcommand: the subcommand's copy only overrides when given.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", type=str.lower, choices=LEVELS, default=argparse.SUPPRESS)
    p = argparse.ArgumentParser(prog="deltaserve", description=__doc__, formatter_class=_HelpFormatter)
    p.add_argument("--log-level", type=str.lower, choices=LEVELS, default="info")
    sub = p.add_subparsers(dest="cmd", required=True)
    kw: dict[str, Any] = {"parents": [common], "formatter_class": _HelpFormatter}
    s = sub.add_parser("serve", help="start the OpenAI-compatible server", **kw)
    add_config_flags(s)
    s.set_defaults(func=cmd_serve)
    g = sub.add_parser("generate", help="offline generation from the command line", **kw)
    add_config_flags(g, (ModelConfig, CacheConfig, SchedulerConfig))
    g.add_argument("prompt", nargs="+")
    g.add_argument("--max-tokens", type=int, default=32)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--sample-seed", type=int, default=None)
    g.add_argument("--ignore-eos", action="store_true")
    g.set_defaults(func=cmd_generate)
    m = sub.add_parser(
        "make-checkpoint", help="write an HF-layout checkpoint (tiny model or 4B config)", **kw
    )
    m.add_argument("dir")
    m.add_argument("--preset", default="tiny", choices=["tiny", "qwen3.5-4b"])
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    m.set_defaults(func=cmd_make_checkpoint)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    # The engine child reads the level from the environment it inherits.
    os.environ[LEVEL_ENV] = ns.log_level
    configure_logging(ns.log_level)
    return int(ns.func(ns) or 0)


if __name__ == "__main__":
    sys.exit(main())
