"""One GRPO step of ragen2 against TRL's GRPOTrainer on the same work; prints JSON.

    pip install trl==1.16.0        # benchmark-only dependency; ragen2 never imports trl
    python benchmarks/vs_trl.py [--threads 1] [--repeats 2] [--new-tokens 64] [--env bandit] [--heap default|kept]

Same work on both sides:
- model: the bundled SmolLM2-135M-Instruct, fp32, CPU, SDPA attention, loaded by ragen2's
  loader (two copies: each trainer updates its own);
- prompts: 4 env instances (ragen2's step seeds) x 4 completions; TRL gets each prompt as text,
  rendered exactly as ragen2's rollout renders it (chat template + the "<answer>"/"<think>"
  tag ragen2 prefills), so both sample after the same tokens;
- lengths pinned: every completion has exactly `--new-tokens` tokens (TRL: min_new_tokens =
  max_completion_length; ragen2: no stop strings and no EOS, patched into this process only);
- reward: the env's own reward (`env.step` on prefill + completion, member i of a group reset
  with rollout_index=i as ragen2 does);
- algorithm: GRPO advantages scaled by the group std, clip 0.2/0.2, per-sequence token-mean
  loss (TRL loss_type="grpo" = ragen2 seq-mean-token-mean), no KL (beta=0 / kl_coef=0, no
  reference model), one optimiser step of AdamW (lr 1e-5, no weight decay, clip 1.0) over 16
  completions in micro-batches of 4; fp32, no gradient checkpointing on either side.
Both skip the separate no-grad forward for the old log-probs when one optimiser step covers
the batch, as here (ragen2: `trainer.needs_old_log_probs`). Known differences that stay: TRL's CPU path runs the
LM head on every position (its compact, response-only path needs Triton), ragen2's only on the
positions that predict a sampled token; ragen2 adds an entropy bonus of 0.001 (TRL computes
the entropy too, for logging).

The two alternate in one process (TRL step, ragen2 step, TRL step, ...): each side's first step
is a warm-up, then the fastest of `--repeats` steps counts, and the ratio is ours / TRL's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from envs.prompt import first_turn_messages
from ragen2 import heap
from ragen2 import metric_names as names
from ragen2 import models as model_lib
from ragen2 import seeding
from ragen2.engines.local import trainer
from ragen2.bench.machine import machine_info
from ragen2.config import load_config
from ragen2.engines.local import learner
from ragen2.rollout import agent_loop
from ragen2.rollout.chat import ChatFormat

GROUPS, GROUP_SIZE, MICRO, LR = 4, 4, 4, 1e-5


def ragen2_config(args):
    return load_config(algo="grpo", overrides=[
        "model.device=cpu", f"env.name={args.env}", "filter.strategy=none", "algo.kl_coef=0", "probe.every=0",
        "rollout.stop_strings=[]",  # no stop string: every reply runs to --new-tokens on both sides
        f"rollout.num_groups={GROUPS}", f"rollout.group_size={GROUP_SIZE}", f"rollout.max_new_tokens={args.new_tokens}",
        "rollout.temperature=1.0", "rollout.top_p=1.0", f"optim.mini_batch_size={GROUPS * GROUP_SIZE}",
        f"optim.micro_batch_size={MICRO}", "optim.ppo_epochs=1", f"optim.actor_lr={LR}", "optim.weight_decay=0",
        "optim.grad_clip=1.0"])


def pin_ragen2_lengths(lengths: list[int]) -> None:
    """No EOS in ragen2's rollout, in this process only; record every length. The rollout samples
    through a GenerationSession (older code also through `agent_loop.generate`): both record."""

    def recording(generate):
        def recording_generate(*a, **kw):
            results = generate(*a, **kw)
            lengths.extend(len(r.token_ids) for r in results)
            return results
        return recording_generate

    agent_loop.eos_token_ids = lambda model, tokenizer: []
    if hasattr(agent_loop, "generate"):
        agent_loop.generate = recording(agent_loop.generate)
    agent_loop.GenerationSession.generate = recording(agent_loop.GenerationSession.generate)


def env_prompt(cfg, tokenizer, seed: int) -> tuple[str, str]:
    """(prompt text as ragen2's rollout renders it, the tag it prefills)."""
    env = trainer.env_factory(cfg)()
    observation, _ = env.reset(seed=seed, options={"rollout_index": 0})
    prefill = "<think>" if env.config.require_think else "<answer>"
    messages = first_turn_messages(env, observation, cfg.rollout.max_response_words)
    return ChatFormat(tokenizer).render(messages, add_generation_prompt=True) + prefill, prefill


def env_reward_function(cfg, lengths: list[int]):
    def env_reward(prompts, completions, completion_ids, seed, prefill, **_):
        rewards = []
        for i, (completion, env_seed, tag) in enumerate(zip(completions, seed, prefill)):
            env = trainer.env_factory(cfg)()
            env.reset(seed=int(env_seed), options={"rollout_index": i % GROUP_SIZE})
            rewards.append(float(env.step(tag + completion)[1]))
        lengths.extend(len(ids) for ids in completion_ids)
        return rewards
    return env_reward


def phase_timer(phases: dict, name: str, fn):
    def timed(*a, **kw):
        started = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - started
    return timed


def build_trl(cfg, args, out_dir, seeds, callback, trl_lengths):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = model_lib.load_tokenizer(cfg.model.name)
    rows = [dict(zip(("prompt", "prefill"), env_prompt(cfg, tokenizer, s)), seed=s) for s in seeds]
    config = GRPOConfig(
        output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, seed=0,
        per_device_train_batch_size=MICRO, gradient_accumulation_steps=GROUPS * GROUP_SIZE // MICRO,
        num_generations=GROUP_SIZE, max_completion_length=args.new_tokens,
        generation_kwargs={"min_new_tokens": args.new_tokens}, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, epsilon=0.2, epsilon_high=0.2, loss_type="grpo", scale_rewards="group", num_iterations=1,
        learning_rate=LR, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0,
        lr_scheduler_type="constant", warmup_steps=0, max_steps=1 + args.repeats, shuffle_dataset=False,
        logging_steps=10_000, save_strategy="no", report_to="none", disable_tqdm=True, log_completions=False)
    policy = model_lib.load_policy(cfg.model.name, dtype=torch.float32)
    trl = GRPOTrainer(model=policy, reward_funcs=env_reward_function(cfg, trl_lengths), args=config,
                      train_dataset=Dataset.from_list(rows), processing_class=tokenizer, callbacks=[callback])
    trl._generate_and_score_completions = phase_timer(callback.phases, "generate_and_score",
                                                      trl._generate_and_score_completions)
    trl._generate = phase_timer(callback.phases, "generate", trl._generate)
    return trl


def make_alternating_callback(ours_step):
    from transformers import TrainerCallback

    class Alternate(TrainerCallback):
        """Times each TRL optimiser step, then runs one ragen2 step between TRL steps."""

        def __init__(self):
            self.phases: dict = {}
            self.trl_steps: list[dict] = []
            self.ours_steps: list[dict] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.phases.clear()
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            seconds = time.perf_counter() - self.started
            step = {"step_s": seconds, **{f"{k}_s": v for k, v in self.phases.items()}}
            step["update_s"] = seconds - self.phases.get("generate_and_score", 0.0)
            self.trl_steps.append(step)
            print(f"trl step {len(self.trl_steps)}: {seconds:.1f} s", file=sys.stderr, flush=True)
            self.ours_steps.append(ours_step())
            print(f"ragen2 step {len(self.ours_steps)}: {self.ours_steps[-1]['step_s']:.1f} s", file=sys.stderr,
                  flush=True)

    return Alternate()


@contextlib.contextmanager
def stdout_to_stderr():
    """Send stdout to stderr at the file-descriptor level: TRL's progress callback writes its log
    dicts through a stream captured before any `redirect_stdout` could take effect."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (0: torch's default); on a shared, loaded machine 1 avoids OpenMP "
                             "threads waiting on each other")
    parser.add_argument("--repeats", type=int, default=2, help="timed steps per side after one warm-up each")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--env", default="bandit", help="a single-turn env")
    parser.add_argument("--heap", choices=("default", "kept"), default="default",
                        help="glibc's allocation defaults (as the figures before 2026-12-04 ran), or freed memory "
                             "kept in the process as the ragen2 command does (ragen2.heap); process-wide, so "
                             "both sides get the same; the JSON's machine.heap says which")
    args = parser.parse_args()
    if args.heap == "kept":
        heap.keep_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")

    cfg = ragen2_config(args)
    ours_lengths, trl_lengths = [], []
    pin_ragen2_lengths(ours_lengths)
    models = learner.Models(model_lib.load_policy(cfg.model.name, dtype=torch.float32),
                          model_lib.load_tokenizer(cfg.model.name), None, None, torch.device("cpu"))
    with tempfile.TemporaryDirectory() as tmp:
        run = trainer.setup(cfg, Path(tmp) / "ours", quiet=True, models=models)

        def ours_step() -> dict:
            started = time.perf_counter()
            metrics = trainer.train_step(run).metrics
            seconds = time.perf_counter() - started
            run.state.step += 1
            phases = {k.removeprefix(names.TIME): v for k, v in metrics.items()
                      if k.startswith(names.TIME) and k != names.TIME_STEP_S}
            return {"step_s": seconds, **phases, "reward_mean": metrics[names.ROLLOUT_REWARD_MEAN]}

        steps = 1 + args.repeats
        seeds = [s for step in range(steps) for s in seeding.step_seeds(cfg, step)]
        callback = make_alternating_callback(ours_step)
        trl = build_trl(cfg, args, str(Path(tmp) / "trl"), seeds, callback, trl_lengths)
        trl.train()
        run.services.log.close()

    expected = steps * GROUPS * GROUP_SIZE
    for side, lengths in (("ragen2", ours_lengths), ("trl", trl_lengths)):
        if len(lengths) != expected or set(lengths) != {args.new_tokens}:
            raise SystemExit(f"{side}: completion lengths not pinned: {sorted(set(lengths))} x {len(lengths)}")
    ours_best = min(callback.ours_steps[1:], key=lambda s: s["step_s"])
    trl_best = min(callback.trl_steps[1:], key=lambda s: s["step_s"])
    rounded = lambda d: {k: round(v, 3) for k, v in d.items()}  # noqa: E731
    report = {
        "work": {"prompts": GROUPS, "completions_per_prompt": GROUP_SIZE, "completion_tokens": args.new_tokens,
                 "env": args.env, "micro_batch": MICRO, "optimizer_steps_per_step": 1,
                 "model": "SmolLM2-135M-Instruct fp32 CPU"},
        "machine": machine_info(),
        "versions": {"trl": __import__("trl").__version__, "transformers": __import__("transformers").__version__},
        "ragen2_best": rounded(ours_best), "trl_best": rounded(trl_best),
        "ragen2_steps_s": [round(s["step_s"], 2) for s in callback.ours_steps],
        "trl_steps_s": [round(s["step_s"], 2) for s in callback.trl_steps],
        "ratio_ragen2_over_trl": round(ours_best["step_s"] / trl_best["step_s"], 3),
        "pairwise_ratios": [round(o["step_s"] / t["step_s"], 3)
                            for o, t in zip(callback.ours_steps[1:], callback.trl_steps[1:])],
        "target_ratio": 0.3,  # issue 31 item 6: ragen2 at most 0.3x TRL's step on the same work
    }
    return report


if __name__ == "__main__":
    with stdout_to_stderr():  # imports (DeepSpeed logs to stdout) and TRL's log dicts: keep stdout JSON
        result = main()
    print(json.dumps(result, indent=2))
