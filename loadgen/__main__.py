"""loadgen command line: pretokenize, run, ab, report."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import httpx

from . import __version__
from .dataset import DatasetError, pretokenize, read_jsonl, write_jsonl
from .metrics import DEFAULT_PERCENTILES


def _add_client_args(p: argparse.ArgumentParser) -> None:
    # Second names are vLLM's (vllm bench serve), so its command lines carry over.
    p.add_argument(
        "--dataset-name",
        choices=("jsonl", "random"),
        default=None,
        help="jsonl: a pretokenized file (--dataset); random: synthetic prompts of random token ids "
        "(default: jsonl when --dataset is given)",
    )
    p.add_argument(
        "--dataset",
        "--dataset-path",
        type=Path,
        default=None,
        help="pretokenized JSONL (loadgen pretokenize)",
    )
    p.add_argument("--random-input-len", type=int, default=1024, help="random dataset: prompt tokens")
    p.add_argument("--random-output-len", type=int, default=128, help="random dataset: output tokens")
    p.add_argument(
        "--random-range-ratio", type=float, default=0.0, help="random dataset: lengths vary by +- this share"
    )
    p.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="random dataset: draw ids from this checkpoint's regular vocabulary (default: the 256 byte ids)",
    )
    p.add_argument("--model", default=None, help="model name sent in requests (default: first of /v1/models)")
    p.add_argument(
        "--concurrency",
        "--max-concurrency",
        type=int,
        default=None,
        help="closed loop: at most N requests in flight",
    )
    p.add_argument("--request-rate", type=float, default=float("inf"), help="open loop arrivals per second")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape: 1 = Poisson, <1 burstier")
    p.add_argument("--seed", type=int, default=0, help="seed for arrival times")
    p.add_argument(
        "--num-prompts", type=int, default=None, help="use the first N records (random dataset: 1000)"
    )
    p.add_argument(
        "--num-warmups", type=int, default=0, help="requests sent (and not counted) before the run"
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false", help="let EOS end a request")
    p.add_argument(
        "--extra-body",
        default=None,
        help='JSON object merged into every request body, e.g. \'{"echo": true, "logprobs": 1}\' (scoring)',
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("DELTASERVE_API_KEY"),
        help="Bearer token (env DELTASERVE_API_KEY)",
    )
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds allowed between chunks")
    p.add_argument(
        "--percentiles", default=",".join(str(int(x)) for x in DEFAULT_PERCENTILES), help="e.g. 90,99"
    )
    p.add_argument("--no-progress", dest="progress", action="store_false")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="loadgen", description="deltaserve benchmark client")
    ap.add_argument("--version", action="version", version=f"loadgen {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("pretokenize", help="ShareGPT JSON -> JSONL of token ids and output lengths")
    p.add_argument("--dataset", required=True, type=Path, help="ShareGPT JSON file")
    p.add_argument("--tokenizer", required=True, type=Path, help="checkpoint dir with tokenizer.json")
    p.add_argument("--output", "-o", required=True, type=Path, help="JSONL to write")
    p.add_argument("--num-prompts", type=int, required=True)
    p.add_argument("--input-len", type=int, default=None, help="exact prompt length (cut or extended)")
    p.add_argument("--output-len", type=int, default=None, help="fixed output length (else the reply's)")
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("run", help="replay a pretokenized JSONL against /v1/completions")
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    _add_client_args(p)
    p.add_argument("--result-file", type=Path, default=None, help="save the result JSON here")
    p.add_argument("--label", default=None, help="free-form label stored in the result")

    p = sub.add_parser("ab", help="order-alternated A/B runs with an A/A noise pair")
    g = p.add_argument_group("targets: two URLs, or two server commands run one at a time on --base-url")
    g.add_argument("--a-url")
    g.add_argument("--b-url")
    g.add_argument("--a-cmd", help='server command line for arm A, e.g. "deltaserve serve --port 8000 ..."')
    g.add_argument("--b-cmd")
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="where --a-cmd/--b-cmd servers listen")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--out-dir", type=Path, default=Path("ab-results"))
    _add_client_args(p)

    p = sub.add_parser("report", help="Markdown summary and PNG plots from result JSONs")
    p.add_argument("results", nargs="+", type=Path)
    p.add_argument("--output", "-o", type=Path, default=None, help="Markdown file (default: stdout)")
    p.add_argument("--plot-dir", type=Path, default=None, help="write PNG plots here (needs matplotlib)")
    return ap


def _client_config(args: argparse.Namespace, base_url: str):
    from .runner import RunConfig

    if args.concurrency is not None and args.concurrency < 1:
        raise SystemExit("loadgen: --concurrency must be at least 1")
    if args.request_rate <= 0:
        raise SystemExit("loadgen: --request-rate must be positive")
    extra: dict = {}
    if args.extra_body is not None:
        try:
            extra = json.loads(args.extra_body)
        except json.JSONDecodeError as e:
            raise SystemExit(f"loadgen: --extra-body is not valid JSON: {e}") from None
        if not isinstance(extra, dict):
            raise SystemExit("loadgen: --extra-body must be a JSON object")
    return RunConfig(
        base_url=base_url,
        model=args.model,
        concurrency=args.concurrency,
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        seed=args.seed,
        num_warmups=args.num_warmups,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        ignore_eos=args.ignore_eos,
        api_key=args.api_key,
        request_timeout=args.request_timeout,
        percentiles=tuple(float(x) for x in args.percentiles.split(",") if x.strip()),
        progress=args.progress,
        extra_body=extra,
    )


def _records(args: argparse.Namespace) -> list[dict]:
    name = args.dataset_name or ("jsonl" if args.dataset is not None else None)
    if name == "random":
        from .random_dataset import BYTE_VOCAB, random_records, regular_vocab_size

        vocab = regular_vocab_size(args.tokenizer) if args.tokenizer else BYTE_VOCAB
        n = args.num_prompts if args.num_prompts is not None else 1000
        return random_records(
            n, args.random_input_len, args.random_output_len, args.random_range_ratio, args.seed, vocab
        )
    if args.dataset is None:
        raise DatasetError("give --dataset FILE.jsonl (loadgen pretokenize) or --dataset-name random")
    recs = read_jsonl(args.dataset)
    if args.num_prompts is not None:
        if args.num_prompts > len(recs):
            raise DatasetError(
                f"{args.dataset}: {len(recs)} records, fewer than --num-prompts {args.num_prompts}"
            )
        recs = recs[: args.num_prompts]
    return recs


def _flags(args: argparse.Namespace) -> dict:
    flags = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    if flags.get("api_key"):
        flags["api_key"] = "<redacted>"
    if flags.get("request_rate") == float("inf"):
        flags["request_rate"] = "inf"
    return flags


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "pretokenize":
            recs = pretokenize(
                args.dataset, args.tokenizer, args.num_prompts, args.seed, args.input_len, args.output_len
            )
            write_jsonl(recs, args.output)
            lens = [len(r["prompt_token_ids"]) for r in recs]
            print(
                f"wrote {len(recs)} requests to {args.output}: prompt tokens {min(lens)}..{max(lens)}, "
                f"output tokens {min(r['output_len'] for r in recs)}..{max(r['output_len'] for r in recs)}",
                file=sys.stderr,
            )
        elif args.command == "run":
            from .report import format_run_table
            from .runner import run_benchmark

            result = asyncio.run(run_benchmark(_client_config(args, args.base_url), _records(args)))
            result["flags"] = _flags(args)
            result["label"] = args.label
            print(format_run_table(result))
            if args.result_file:
                with open(args.result_file, "w", encoding="utf-8") as f:
                    json.dump(result, f, indent=1)
                print(f"saved {args.result_file}", file=sys.stderr)
            return 0 if result["completed"] > 0 else 1
        elif args.command == "ab":
            from .ab import run_ab

            run_ab(
                _client_config(args, args.base_url),
                _records(args),
                args.out_dir,
                pairs=args.pairs,
                a_url=args.a_url,
                b_url=args.b_url,
                a_cmd=args.a_cmd,
                b_cmd=args.b_cmd,
                startup_timeout=args.startup_timeout,
            )
        elif args.command == "report":
            from .report import load_results, markdown_summary, plot

            results = load_results(args.results)
            md = markdown_summary(results)
            if args.plot_dir is not None:
                files = plot(results, args.plot_dir)
                if not files:
                    print("matplotlib is not installed: no plots (pip install matplotlib)", file=sys.stderr)
                md += "".join(f"\n![{p.stem}]({p})\n" for p in files)
            if args.output:
                args.output.write_text(md, encoding="utf-8")
            else:
                print(md)
    except (DatasetError, ValueError, RuntimeError, TimeoutError, OSError, httpx.HTTPError) as e:
        print(f"loadgen: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
