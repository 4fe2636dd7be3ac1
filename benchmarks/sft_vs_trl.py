"""`ragen2 sft`'s training step against TRL's SFTTrainer on the same demos and model; prints JSON.

    pip install trl==1.16.0        # the trl extra; benchmark-only here
    python benchmarks/sft_vs_trl.py [--env frozen_lake] [--reasoning grounded] [--demos 4] [--micro 1 4]
                                    [--repeats 2] [--threads 1] [--out docs/benchmarks/sft_vs_trl.json]

Same work on both sides (issue 49 item 4):
- demos: one file written by `ragen2 demos --env ENV --reasoning R --episodes N` (the env's preset
  turn rules), loaded by ragen2 (`ragen2.demos.read_demos`) and by TRL as the JSONL it is
  (`datasets.load_dataset("json")`);
- model: the bundled SmolLM2-135M-Instruct, fp32, CPU, one copy per side, both loaded by ragen2's
  loader (same weights, same attention implementation), no gradient checkpointing;
- step: one AdamW step (lr 5e-5, betas 0.9/0.999, no weight decay, clip 1.0) over all N demos, in
  micro-batches of `--micro` rows, the same on both sides (ragen2: optim.micro_batch_size, a
  memory budget of that many longest rows; with sft.padding_free, its default, the tokens all the
  step's rows start with are encoded once for the step and each micro-batch runs as one unpadded
  sequence, its rows' shared prompts once; `--no-padding-free`: optim.shared_prefix's padded
  passes. TRL: per_device_train_batch_size, padded to the longest row, with gradient accumulation
  over the rest; `--trl-padding-free`: TRL's padding_free=True, one flattened row);
- loss: token-mean NLL of the assistant tokens: ragen2's rollout response mask; TRL's
  assistant_only_loss with `ragen2.integrations.trl.sft.training_chat_template`, which marks the
  same tokens (tests/ragen2/integrations/test_trl_sft.py). Both sides' first-step losses are in
  the JSON: equal weights and equal tokens give equal losses, a check that the work is the same.
Tokens/s counts the same tokens on both sides: the demos' chat tokens as TRL tokenizes them
("fed"; ragen2's rows stop at the last assistant token, 2 tokens per demo fewer, also reported),
and the assistant tokens trained. Known differences that stay: TRL's CPU loss projects the LM head
on every position and computes entropy and token accuracy for its logs; ragen2 projects only the
positions that predict a trained token.

For each `--micro` value the two alternate in one process (TRL step, ragen2 step, ...; ragen2's
runs from TRL's step-end callback): each side's first step is a warm-up; the speedup is TRL's step
time over ragen2's, the median of the pairwise ratios. The JSON also compares each side at its
fastest micro-batch size (those settings ran one after the other, so load drift enters there).
Memory: two fp32 models with AdamW side by side, and TRL's 4-row micro-batch, peak near 8 GB (a
run was OOM-killed there on a 23 GB machine shared with two calibration runs): run it on a quiet one.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ragen2 import heap  # noqa: E402
from ragen2.bench.machine import code_version, emit_report, machine_info  # noqa: E402

TARGET_SPEEDUP = 1.5  # issue 49 item 4: ragen2 sft at least 1.5x TRL's SFTTrainer, or use TRL's


def write_demos(env: str, reasoning: str, episodes: int, folder: Path) -> Path:
    from ragen2.cli import main as cli

    path = folder / "demos.jsonl"
    if cli(["demos", "--env", env, "--episodes", str(episodes), "--reasoning", reasoning, "--out", str(path)]) != 0:
        raise SystemExit("ragen2 demos failed")
    return path


def ours_setup(path: Path, args, micro: int):
    """ragen2 sft's config (the command's own composition), policy, optimiser and rows."""
    from ragen2.commands.sft import compose
    from ragen2.demos import read_demos
    from ragen2.engines.local import learner, sft

    demos = read_demos(path)
    flags = SimpleNamespace(demos=str(path), model="bundled", out=None, seed=None, steps=1 + args.repeats, overrides=[
        "model.dtype=float32", "model.device=cpu", f"sft.batch_episodes={len(demos)}", "sft.warmup_steps=0",
        f"optim.micro_batch_size={micro}", f"optim.shared_prefix={str(not args.no_shared_prefix).lower()}",
        f"sft.padding_free={str(not args.no_padding_free).lower()}",
        "optim.grad_clip=1.0", "optim.weight_decay=0.0"])
    cfg = compose(flags, demos)
    models = sft.build_policy(cfg)
    optimizer = learner.build_optimizers(models, cfg).actor
    rows = sft.demo_rows(demos, models.tokenizer, cfg)
    return cfg, models, optimizer, rows


def trl_setup(path: Path, args, micro: int, cfg, folder: Path, callback):
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    from ragen2 import models as model_lib
    from ragen2.integrations.trl.sft import training_chat_template

    tokenizer = model_lib.load_tokenizer(cfg.model.name, padding_side="right")
    tokenizer.chat_template = training_chat_template(tokenizer.chat_template)
    data = load_dataset("json", data_files=str(path), split="train", cache_dir=str(folder / "cache"))
    config = SFTConfig(
        output_dir=str(folder / "trl"), use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, seed=0,
        assistant_only_loss=True, max_length=None, per_device_train_batch_size=micro, padding_free=args.trl_padding_free,
        gradient_accumulation_steps=len(data) // micro, learning_rate=cfg.sft.lr, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0,
        max_steps=1 + args.repeats, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True)
    policy = model_lib.load_policy(cfg.model.name, dtype=torch.float32)
    trainer = SFTTrainer(model=policy, args=config, train_dataset=data, processing_class=tokenizer,
                         callbacks=[callback])
    lengths = [len(ids) for ids in trainer.train_dataset["input_ids"]]
    # TRL folds the assistant mask into `labels` (-100 outside) when it prepares the dataset
    trained = [sum(label != -100 for label in labels) for labels in trainer.train_dataset["labels"]]
    return trainer, {"fed": sum(lengths), "trained": sum(trained), "longest": max(lengths)}


def alternating_callback(ours_step):
    from transformers import TrainerCallback

    class Alternate(TrainerCallback):
        """Times each TRL optimiser step, then runs one ragen2 step before TRL's next."""

        def __init__(self):
            self.trl_steps: list[float] = []
            self.ours_steps: list[dict] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.trl_steps.append(time.perf_counter() - self.started)
            self.ours_steps.append(ours_step(len(self.ours_steps)))
            print(f"step {len(self.trl_steps)}: trl {self.trl_steps[-1]:.1f} s, ragen2 "
                  f"{self.ours_steps[-1]['step_s']:.1f} s", file=sys.stderr, flush=True)

    return Alternate()


def ragen2_decoder_tokens(rows, all_rows: list[int], cfg, models) -> int:
    """Decoder positions of one ragen2 sft step: its micro-batches as sft_step forms them."""
    from ragen2 import shared_prefix as prefix_lib

    ids, attn, index = rows.input_ids, rows.attention_mask, torch.tensor(all_rows)
    padding_free = cfg.sft.padding_free and prefix_lib.padding_free_supported(models.policy.get_decoder())
    if not (cfg.optim.shared_prefix or padding_free):
        return sum(int(attn[part].sum(dim=1).max()) * len(part) for part in index.split(cfg.optim.micro_batch_size))
    attention = prefix_lib.attention_cost(models.policy)
    skip = prefix_lib.step_prefix_length(rows, index) if padding_free else 0  # encoded once a step (sft.step_prefix)
    parts = prefix_lib.micro_batches(rows, index, cfg.optim.micro_batch_size, attention=attention,
                                     padding_free=prefix_lib.PaddingFree(skip) if padding_free else None)
    return skip + sum(prefix_lib.fed_tokens(ids[part, skip:], attn[part, skip:], attention, padding_free)
                      for part in parts)


def shared_prefix_tokens(rows) -> int:
    """Tokens every demo row starts with (the system prompt and what follows it alike)."""
    ids, lengths = rows.input_ids, rows.attention_mask.sum(dim=1)
    same = (ids == ids[:1]).all(dim=0).long().cumprod(dim=0).sum()
    return int(min(same, lengths.min()))


def run_setting(path: Path, args, micro: int, folder: Path) -> dict:
    """One micro-batch size on both sides: TRL and ragen2 steps alternating; times, tokens, losses."""
    from ragen2.engines.local import sft

    cfg, models, optimizer, rows = ours_setup(path, args, micro)
    all_rows = list(range(rows.input_ids.shape[0]))

    def ours_step(step: int) -> dict:
        started = time.perf_counter()
        metrics = sft.sft_step(models, optimizer, rows, all_rows, cfg, step)
        return {"step_s": time.perf_counter() - started, "loss": metrics[sft.SFT_LOSS]}

    callback = alternating_callback(ours_step)
    trainer, trl_tokens = trl_setup(path, args, micro, cfg, folder / f"micro{micro}", callback)
    trl_positions = []  # decoder positions of each TRL micro-batch, padding included
    collate = trainer.data_collator

    def recording_collate(examples):
        batch = collate(examples)
        trl_positions.append(int(batch["input_ids"].numel()))
        return batch

    trainer.data_collator = recording_collate  # read when train() builds its dataloader
    load_before = machine_info(with_torch=False)["load_avg"]
    print(f"micro-batch {micro}: load {load_before}", file=sys.stderr, flush=True)
    trainer.train()
    trl_losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    trl_s, ours_s = callback.trl_steps[1:], [s["step_s"] for s in callback.ours_steps[1:]]
    per_step = len(trl_positions) // max(1, len(callback.trl_steps))
    trl_decoder = [sum(trl_positions[i:i + per_step]) for i in range(0, len(trl_positions), per_step)]
    pairwise = [t / o for t, o in zip(trl_s, ours_s)]
    # the same token counts on both sides: TRL's tokenization of the chats, and the assistant tokens
    per_s = lambda tokens, seconds: round(tokens / seconds, 1)  # noqa: E731
    trl_median, ours_median = statistics.median(trl_s), statistics.median(ours_s)
    return {
        "micro_batch": micro,
        "tokens_per_step": {"fed_trl": trl_tokens["fed"], "fed_ragen2_rows": int(rows.attention_mask.sum()),
                            "shared_by_all_rows": shared_prefix_tokens(rows),
                            "trained_trl": trl_tokens["trained"], "trained_ragen2": int(rows.response_mask.sum())},
        # what each decoder pass is fed: TRL pads a micro-batch to its longest row; ragen2 packs rows
        # sharing a prefix (encoded once) and pads their suffixes, or runs a row alone
        "decoder_tokens_per_step": {"trl": trl_decoder, "ragen2": ragen2_decoder_tokens(rows, all_rows, cfg, models)},
        "first_loss": {"trl": trl_losses[0] if trl_losses else None, "ragen2": callback.ours_steps[0]["loss"]},
        "trl_steps_s": [round(x, 2) for x in callback.trl_steps],
        "ragen2_steps_s": [round(x["step_s"], 2) for x in callback.ours_steps],
        "median_step_s": {"trl": round(trl_median, 2), "ragen2": round(ours_median, 2)},
        "tokens_per_s": {
            "trl": {"fed": per_s(trl_tokens["fed"], trl_median), "trained": per_s(trl_tokens["trained"], trl_median)},
            "ragen2": {"fed": per_s(trl_tokens["fed"], ours_median),
                       "trained": per_s(trl_tokens["trained"], ours_median)}},
        "speedup_ragen2_over_trl": round(statistics.median(pairwise), 3),
        "pairwise_speedups": [round(r, 3) for r in pairwise],
        "load_avg_at_start": load_before,
    }


def main() -> tuple[dict, str | None]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="frozen_lake")
    parser.add_argument("--reasoning", default="grounded", choices=("none", "grounded", "template"))
    parser.add_argument("--demos", type=int, default=4, help="demos per optimiser step (all of them, each step)")
    parser.add_argument("--micro", type=int, nargs="+", default=[1, 4],
                        help="rows per micro-batch, the same on both sides; one side-by-side run per value")
    parser.add_argument("--repeats", type=int, default=2, help="timed steps per side after one warm-up each")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a shared machine: 1)")
    parser.add_argument("--no-shared-prefix", action="store_true", help="ragen2 with optim.shared_prefix=false")
    parser.add_argument("--no-padding-free", action="store_true", help="ragen2 with sft.padding_free=false")
    parser.add_argument("--trl-padding-free", action="store_true",
                        help="TRL with padding_free=True (one flattened row a micro-batch; transformers masks "
                             "the rows apart from the position ids)")
    parser.add_argument("--out", default=None, help="also write the JSON here (docs/benchmarks/sft_vs_trl.json)")
    args = parser.parse_args()
    if any(args.demos % micro for micro in args.micro):
        raise SystemExit("--demos must be a multiple of each --micro (TRL accumulates whole micro-batches)")
    heap.keep_freed_memory()  # as the ragen2 command does; process-wide, so TRL gets it too
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    code = code_version()  # ragen2's side runs this checkout as imported now: its commit, and whether edited

    with tempfile.TemporaryDirectory() as tmp:
        path = write_demos(args.env, args.reasoning, args.demos, Path(tmp))
        settings = []
        for micro in args.micro:
            settings.append(run_setting(path, args, micro, Path(tmp)))
            gc.collect()  # the setting's two models and optimisers go before the next pair loads
    # Each side at its fastest micro-batch size (settings run one after another, not alternating).
    fastest = {side: min(settings, key=lambda s: s["median_step_s"][side]) for side in ("trl", "ragen2")}
    speedup = fastest["trl"]["median_step_s"]["trl"] / fastest["ragen2"]["median_step_s"]["ragen2"]
    same_micro = {str(s["micro_batch"]): s["speedup_ragen2_over_trl"] for s in settings}
    report = {
        "command": "python " + " ".join(["benchmarks/sft_vs_trl.py", *sys.argv[1:]]),
        "work": {"env": args.env, "reasoning": args.reasoning, "demos_per_step": args.demos,
                 "model": "SmolLM2-135M-Instruct (bundled) fp32 CPU", "optimizer": "AdamW lr 5e-5, clip 1.0",
                 "ragen2_shared_prefix": not args.no_shared_prefix, "ragen2_padding_free": not args.no_padding_free,
                 "trl_padding_free": args.trl_padding_free, "timed_steps_per_side": args.repeats},
        "settings": settings,
        "speedup_at_the_same_micro_batch": same_micro,
        "fastest_micro_batch": {side: fastest[side]["micro_batch"] for side in fastest},
        "speedup_fastest_vs_fastest": round(speedup, 3),
        "target_speedup": TARGET_SPEEDUP,
        "target_met_at_every_same_micro_batch": all(v >= TARGET_SPEEDUP for v in same_micro.values()),
        "target_met_fastest_vs_fastest": speedup >= TARGET_SPEEDUP,
        "machine": machine_info(),
        "code_at_start": code,
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": {"trl": __import__("trl").__version__, "transformers": __import__("transformers").__version__,
                     "torch": torch.__version__},
    }
    return report, args.out


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vs_trl import stdout_to_stderr  # TRL writes its log dicts to stdout: keep stdout JSON

    with stdout_to_stderr():
        result, out = main()
    emit_report(result, out)
