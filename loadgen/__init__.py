"""loadgen: the deltaserve benchmark client.

Subcommands (see ``python -m loadgen --help``):
  pretokenize  ShareGPT JSON -> JSONL of prompt token ids and output lengths
  run          replay a JSONL against /v1/completions, vLLM ``bench serve`` metrics
  ab           order-alternated A/B runs between two servers or two server commands
  report       Markdown summary and optional PNG plots from result JSONs
"""

__version__ = "0.1.0"
