"""`python -m client "prompt" [--chat] [--stream] [--max-tokens N]` (also installed as deltaserve-client)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from client.api import APIError, DeltaClient


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deltaserve-client", description="Query a deltaserve server.")
    p.add_argument("prompt", help="prompt text (the user message with --chat)")
    p.add_argument("--base-url", default=os.environ.get("DELTASERVE_BASE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--api-key", default=os.environ.get("DELTASERVE_API_KEY"), help="or $DELTASERVE_API_KEY")
    p.add_argument("--model", default=None, help="model name (default: the server's only model)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    p.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    p.add_argument("--timeout", type=float, default=600.0)
    return p


async def _run(args: argparse.Namespace) -> None:
    params = {"model": args.model, "temperature": args.temperature, "seed": args.seed}
    params = {k: v for k, v in params.items() if v is not None}
    messages = [{"role": "user", "content": args.prompt}]
    async with DeltaClient(args.base_url, api_key=args.api_key, timeout=args.timeout) as client:
        if args.stream:
            stream = (
                client.stream_chat(messages, max_tokens=args.max_tokens, **params)
                if args.chat
                else client.stream_complete(args.prompt, max_tokens=args.max_tokens, **params)
            )
            async for chunk in stream:
                for choice in chunk.choices:
                    sys.stdout.write(choice.text)
                    sys.stdout.flush()
            sys.stdout.write("\n")
        elif args.chat:
            print((await client.chat(messages, max_tokens=args.max_tokens, **params)).content)
        else:
            print((await client.complete(args.prompt, max_tokens=args.max_tokens, **params)).text)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        asyncio.run(_run(args))
    except APIError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
