"""Where can a CPU run of the bundled model show anything multi-turn? Measure, per setting, the share
of the untrained model's groups whose rewards differ (the only groups a filter keeps or a
group-relative advantage learns from), with success, format and reward.

    python scripts/multiturn_calibration.py --out docs/benchmarks/multiturn_calibration.json

Each setting rolls out `--groups` instances x `--group-size` episodes with the training rollout
code at the training temperature (1.0), on the evaluation seed stream. The JSON names the CPU, the
dtype and the command; a setting's `example` shows one episode's first replies.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

# (env, env overrides, rollout overrides): answer-only throughout (the bundled model never closes
# <think>); small maps, fewer turns and actions, more tokens than the presets' 48.
SETTINGS = [
    ("frozen_lake", {"require_think": False}, {"max_turns": 5, "max_new_tokens": 48}),
    ("frozen_lake", {"require_think": False, "size": 3}, {"max_turns": 3, "max_new_tokens": 24}),
    ("frozen_lake", {"require_think": False, "size": 3, "success_rate": 1.0, "max_actions_per_turn": 1},
     {"max_turns": 4, "max_new_tokens": 24}),
    ("frozen_lake", {"require_think": False, "size": 2, "max_actions_per_turn": 1},
     {"max_turns": 3, "max_new_tokens": 24}),
    ("frozen_lake", {"require_think": False, "size": 3, "instruction_style": "explicit"},
     {"max_turns": 3, "max_new_tokens": 24}),
    ("sokoban", {"require_think": False, "dim_x": 5, "dim_y": 5, "search_depth": 5}, {"max_turns": 3, "max_new_tokens": 24}),
    ("sokoban", {"require_think": False, "dim_x": 5, "dim_y": 5, "search_depth": 5, "instruction_style": "explicit"},
     {"max_turns": 3, "max_new_tokens": 24}),
]


def measure(policy, tokenizer, env_name, env_overrides, rollout_cfg, groups, seed):
    import torch

    import envs
    from ragen2.rollout import rollout
    from ragen2.seeding import eval_sampling_seed, eval_seeds

    entry = envs.spec(env_name)
    env_config = entry.make_config(**env_overrides)
    seeds = eval_seeds(seed, groups)
    generator = torch.Generator().manual_seed(eval_sampling_seed(seed))
    started = time.perf_counter()
    batch = rollout(policy, tokenizer, lambda: entry.env_cls(env_config), seeds, rollout_cfg, generator)
    wall = time.perf_counter() - started
    by_group: dict[int, list] = {}
    for t in batch.trajectories:
        by_group.setdefault(t.group, []).append(t)
    rewards = [[round(t.reward, 6) for t in by_group[g]] for g in sorted(by_group)]
    spread = [max(r) - min(r) > 1e-9 for r in rewards]
    trajectories = batch.trajectories
    formats = [ok for t in trajectories for ok in t.format_ok]
    first = trajectories[0]
    return {"groups_with_spread": sum(spread), "groups": len(rewards), "spread_share": sum(spread) / len(rewards),
            "success_rate": sum(t.success for t in trajectories) / len(trajectories),
            "format_ok_share": sum(formats) / len(formats), "reward_mean": sum(map(sum, rewards)) / len(trajectories),
            "turns_mean": sum(len(t.turn_rewards) for t in trajectories) / len(trajectories),
            "group_rewards": rewards, "wall_s": round(wall, 1),
            "example": {"observation": first.observations[0][:300], "responses": first.response_texts[:2],
                        "turn_rewards": first.turn_rewards}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", type=int, nargs="*", help="indices of SETTINGS to run")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/multiturn_calibration.json"))
    args = parser.parse_args(argv)

    import torch

    from ragen2 import models as model_lib
    from ragen2.bench.machine import cpu_name
    from ragen2.rollout import RolloutConfig

    torch.set_num_threads(args.threads)
    source = model_lib.resolve_model_source("bundled")
    tokenizer = model_lib.load_tokenizer(source)
    policy = model_lib.load_policy(source, dtype="float32", device=torch.device("cpu"))
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    done = {json.dumps([r["env"], r["env_overrides"], r["rollout"]]): r for r in previous.get("settings", [])}
    results = []
    for index, (env_name, env_overrides, rollout_overrides) in enumerate(SETTINGS):
        key = json.dumps([env_name, env_overrides, rollout_overrides])
        if args.only is not None and index not in args.only:
            if key in done:
                results.append(done[key])
            continue
        rollout_cfg = dataclasses.replace(RolloutConfig(), group_size=args.group_size, temperature=1.0,
                                          **rollout_overrides)
        row = {"env": env_name, "env_overrides": env_overrides, "rollout": rollout_overrides,
               **measure(policy, tokenizer, env_name, env_overrides, rollout_cfg, args.groups, args.seed)}
        results.append(row)
        print(f"[{index}] {env_name} {env_overrides} {rollout_overrides}: spread in {row['groups_with_spread']}/"
              f"{row['groups']} groups, success {row['success_rate']:.2f}, format {row['format_ok_share']:.2f}, "
              f"{row['wall_s']} s", file=sys.stderr, flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "command": "python scripts/multiturn_calibration.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "cpu": cpu_name(), "dtype": "float32", "torch_threads": args.threads, "model": "bundled",
            "temperature": 1.0, "groups": args.groups, "group_size": args.group_size, "seed": args.seed,
            "settings": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
