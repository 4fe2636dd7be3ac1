"""The `ragen2` subcommands: one module each (`ragen2.commands.<name>`), holding its
`add_parser(subparsers)` and `run(args)`, imported only when its command runs.

The one-line helps live here, so `ragen2 --help` lists every command without importing any.
"""

from __future__ import annotations

# name -> one-line help, in the order `ragen2 --help` lists them
COMMANDS = {
    "envs": "list, show and play the environments",
    "train": "train an agent (local engine)",
    "plot": "write PNG training curves for a run directory",
    "audit": "collapse diagnostics: HTML report for a run, or a verdict for any model",
    "bench": "run a benchmark suite (a matrix of training runs), or rebuild its report",
    "demos": "write expert demonstrations (chat JSONL) for a supervised warm start",
    "sft": "supervised warm start on demonstrations: a model that train, eval, audit and export take",
    "eval": "evaluate a checkpoint or model on an env (held-out variants)",
    "export": "write a checkpoint as a Hugging Face folder (config.json, tokenizer, weights)",
}


def module_name(command: str) -> str:
    return f"{__name__}.{command}"
