"""How much exact packing saves `ragen2 sft` on a demos file: decoder tokens fed per step, counted
(no model runs), for its padding-free passes and its padded shared-prefix ones; prints JSON.

    python benchmarks/sft_packing_ceiling.py [--demos runs/calibration/frozen_lake-grounded.jsonl]
        [--rows 64] [--per-step 8] [--micro 1 2 3 4] [--out docs/benchmarks/sft_packing_ceiling.json]

Issue 49 item 4 asks `ragen2 sft` to run at least 1.5x TRL's SFTTrainer with shared-prefix packing
as the lever. The work a step does is proportional to the tokens its passes feed the decoder (plus
the LM head on the positions it projects). This counts, for the steps `ragen2 sft` takes
(`--per-step` demos each):
- `own`: every row's own tokens, no padding and no sharing (TRL at one row a micro-batch);
- `padding_free`: what `sft_step` feeds with sft.padding_free (its default) at each `--micro`: the
  step's common prefix once (`shared_prefix.EncodedPrefix`), then each micro-batch as one unpadded
  sequence (`shared_prefix.micro_batches` with `padding_free` and `skip`, `fed_tokens`);
- `padded`: with sft.padding_free=false, the padded shared-prefix passes (optim.shared_prefix: rows
  sharing a prefix run it once, the suffixes of a pass padded to its longest);
- `prefix_once`: the step's common prefix once plus every row's own suffix whole (what
  one-row micro-batches feed padding-free; rows of one micro-batch that share more feed less).
The speedup over TRL at one row a micro-batch is then predicted from multiply-accumulates per
token: TRL runs the decoder and the LM head on its `own` tokens; ragen2 the decoder on what it
feeds and the head on the trained (assistant) tokens alone. Attention is not counted (it grows
with the keys each token reads, about the same on both sides), so measured steps
(benchmarks/sft_vs_trl.py) can fall short of these predictions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ragen2 import models as model_lib  # noqa: E402
from ragen2 import shared_prefix as prefix_lib  # noqa: E402
from ragen2.bench.machine import code_version, emit_report, machine_info  # noqa: E402


def common_prefix(input_ids: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor) -> int:
    ids = input_ids[rows]
    shortest = int(lengths[rows].min())
    same = (ids[:, :shortest] == ids[:1, :shortest]).all(dim=0).long()
    return int(same.cumprod(0).sum())


def fed(batch, rows: torch.Tensor, micro: int, attention: float, padding_free: bool) -> int:
    """Decoder tokens one sft_step over `rows` feeds (see sft.sft_step and sft.step_prefix)."""
    lengths = batch.attention_mask.sum(1)
    skip = prefix_lib.step_prefix_length(batch, rows) if padding_free else 0
    parts = prefix_lib.micro_batches(batch, rows, micro, attention=attention,
                                     padding_free=prefix_lib.PaddingFree(skip) if padding_free else None)
    total = skip
    for part in parts:
        width = int(lengths[part].max())
        total += prefix_lib.fed_tokens(batch.input_ids[part, skip:width], batch.attention_mask[part, skip:width],
                                       attention, padding_free)
    return total


def main() -> int:
    from ragen2.commands.sft import compose
    from ragen2.demos import read_demos
    from ragen2.engines.local.sft import demo_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demos", default="runs/calibration/frozen_lake-grounded.jsonl")
    parser.add_argument("--rows", type=int, default=64, help="demos counted (whole steps of --per-step)")
    parser.add_argument("--per-step", type=int, default=8, help="demos a step trains on (sft.batch_episodes)")
    parser.add_argument("--micro", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    demos = read_demos(args.demos)[:args.rows]
    cfg = compose(SimpleNamespace(demos=args.demos, model=None, out="/tmp/unused", seed=0, steps=1, overrides=[]),
                  demos)
    tokenizer = model_lib.load_tokenizer(model_lib.resolve_model_source(cfg.model.name))
    batch = demo_rows(demos, tokenizer, cfg)
    lengths = batch.attention_mask.sum(1)
    config = AutoConfig.from_pretrained(model_lib.resolve_model_source(cfg.model.name))  # shapes, no weights
    attention = prefix_lib.attention_cost(SimpleNamespace(config=config))  # as the engine's passes estimate it
    hidden, kv = config.hidden_size, config.num_key_value_heads * config.hidden_size // config.num_attention_heads
    steps = [torch.arange(start, start + args.per_step) for start in range(0, len(demos) - args.per_step + 1,
                                                                           args.per_step)]
    own = sum(int(lengths[rows].sum()) for rows in steps)
    prefixes = [common_prefix(batch.input_ids, rows, lengths) for rows in steps]
    prefix_once = sum(p + int((lengths[rows] - p).sum()) for p, rows in zip(prefixes, steps))
    settings = []
    for micro in args.micro:
        packed = sum(fed(batch, rows, micro, attention, padding_free=True) for rows in steps)
        padded = sum(fed(batch, rows, micro, attention, padding_free=False) for rows in steps)
        settings.append({"micro_batch": micro, "padding_free_fed_over_own": round(packed / own, 3),
                         "padded_fed_over_own": round(padded / own, 3)})
    body = config.num_hidden_layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * config.intermediate_size)
    head = hidden * config.vocab_size
    trained = sum(int(batch.response_mask[rows].sum()) for rows in steps)

    def predicted(fed_over_own: float) -> float:  # TRL's work over ragen2's, per step
        return round(own * (body + head) / (fed_over_own * own * body + trained * head), 3)

    report = {
        "command": "python " + " ".join(sys.argv),
        "demos": args.demos, "rows": len(steps) * args.per_step, "per_step": args.per_step,
        "row_tokens_mean": round(float(lengths[:len(steps) * args.per_step].float().mean()), 1),
        "row_tokens_min_max": [int(lengths.min()), int(lengths.max())],
        "common_prefix_tokens_mean": round(sum(prefixes) / len(prefixes), 1),
        "own_tokens": own, "settings": settings,
        "prefix_once_fed_over_own": round(prefix_once / own, 3),
        "macs_per_token": {"decoder": body, "lm_head": head}, "trained_tokens": trained,
        "predicted_speedup_over_trl": {
            "padding_free": {str(s["micro_batch"]): predicted(s["padding_free_fed_over_own"]) for s in settings},
            "padded": {str(s["micro_batch"]): predicted(s["padded_fed_over_own"]) for s in settings},
            "prefix_once": predicted(prefix_once / own)},
        "code": code_version(), "machine": machine_info(with_torch=True),
    }
    emit_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
