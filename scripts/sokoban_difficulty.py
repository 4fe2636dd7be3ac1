"""Room difficulty of both Sokoban generators: BFS shortest solutions over seeds 0..N-1.

    python scripts/sokoban_difficulty.py [--seeds 1000]

Prints JSON. For each registered setting (`sokoban` 6x6 / 1 box / search_depth 300,
`larger_sokoban` 8x8 / 2 boxes / 10) and each generator (`ragen`, the default: RAGEN-2's
rooms; `reverse_bfs`: ours), every room is solved by breadth-first search
(`envs.sokoban_solver`) and the report gives the mean shortest solution, its histogram, and
the share of rooms needing more moves than the 10-action budget (a room the agent cannot
solve however well it plays).

With $RAGEN_SOKOBAN_UTILS pointing at RAGEN-2's `ragen/env/sokoban/utils.py` (it needs only
numpy and matplotlib), its `generate_room` runs too, seeded as its env seeds it, and the
report counts the seeds whose room equals ours. RAGEN-2 retries a failed draw with
`abs(hash(str(seed))) % 2**32`, which changes with PYTHONHASHSEED; those seeds are counted
apart (`reference_failed_draws`) and left out of the comparison.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import time
from pathlib import Path

import numpy as np

from envs.sokoban import VARIANTS
from envs.sokoban_generator import generate_room, num_walk_steps
from envs.sokoban_ragen import generate_ragen_room
from envs.sokoban_solver import shortest_solution
from ragen2.bench.machine import machine_info

SETTINGS = {"6x6_1box": "sokoban", "8x8_2box": "larger_sokoban"}
ACTION_BUDGET = 10  # max_actions_per_traj of every Sokoban variant, RAGEN-2's too


def make_room(generator: str, seed: int, config):
    args = (config.dim_x, config.dim_y, config.num_boxes, config.search_depth)
    if generator == "ragen":
        return generate_ragen_room(seed, *args)
    return generate_room(np.random.default_rng(seed), *args)


def distribution(lengths: list[int]) -> dict:
    values = np.array(lengths)
    counts = np.bincount(values)
    return {
        "rooms": len(lengths),
        "mean_shortest_solution": round(float(values.mean()), 3),
        "median_shortest_solution": float(np.median(values)),
        "max_shortest_solution": int(values.max()),
        f"share_over_{ACTION_BUDGET}_actions": round(float((values > ACTION_BUDGET).mean()), 4),
        f"share_needing_all_{ACTION_BUDGET}_or_more": round(float((values >= ACTION_BUDGET).mean()), 4),
        "histogram": {str(n): int(c) for n, c in enumerate(counts) if c},
    }


def measure_generator(generator: str, config, seeds: int) -> dict:
    lengths, unsolved = [], 0
    start = time.perf_counter()
    for seed in range(seeds):
        room = make_room(generator, seed, config)
        # Solve from scratch rather than trust the generator's own solution.
        solution = shortest_solution(room.fixed, room.dim_y, room.boxes, room.player)
        if solution is None:
            unsolved += 1
            continue
        lengths.append(len(solution))
    result = distribution(lengths)
    result["unsolvable_rooms"] = unsolved
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


def load_reference():
    path = os.environ.get("RAGEN_SOKOBAN_UTILS")
    if not path:
        return None, "set $RAGEN_SOKOBAN_UTILS to RAGEN-2's ragen/env/sokoban/utils.py to compare rooms"
    if not Path(path).is_file():
        return None, f"$RAGEN_SOKOBAN_UTILS={path} is not a file"
    spec = importlib.util.spec_from_file_location("ragen_sokoban_utils_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, f"loaded {path}"


def compare_with_reference(module, config, seeds: int) -> dict:
    same = failed = 0
    dim = (config.dim_x, config.dim_y)
    saved = random.getstate(), np.random.get_state()
    try:
        for seed in range(seeds):
            random.seed(seed)  # RAGEN-2's all_seed(seed)
            np.random.seed(seed)
            try:
                fixed, state, _, _ = module.generate_room(dim=dim, num_steps=num_walk_steps(*dim),
                                                          num_boxes=config.num_boxes,
                                                          search_depth=config.search_depth)
            except (RuntimeError, RuntimeWarning):
                failed += 1
                continue
            flat = state.flatten()
            theirs = (tuple(int(v) for v in fixed.flatten()), tuple(int(i) for i in np.flatnonzero(flat == 4)),
                      int(np.flatnonzero(flat == 5)[0]))
            room = generate_ragen_room(seed, *dim, config.num_boxes, config.search_depth)
            same += (room.fixed, room.boxes, room.player) == theirs and room.attempts == 1
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
    return {"seeds": seeds, "reference_failed_draws": failed, "same_room": same,
            "compared": seeds - failed}


def measure(seeds: int = 1000) -> dict:
    module, status = load_reference()
    report = {"machine": machine_info(with_torch=False), "numpy": np.__version__, "seeds": f"0..{seeds - 1}",
              "action_budget": ACTION_BUDGET,
              "reference": status, "settings": {}}
    for label, variant in SETTINGS.items():
        config = VARIANTS[variant].config
        entry = {"variant": variant, "dim_x": config.dim_x, "dim_y": config.dim_y, "num_boxes": config.num_boxes,
                 "search_depth": config.search_depth}
        for generator in ("ragen", "reverse_bfs"):
            entry[generator] = measure_generator(generator, config, seeds)
        if module is not None:
            entry["ragen_vs_reference"] = compare_with_reference(module, config, seeds)
        report["settings"][label] = entry
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=1000, help="seeds 0..N-1 per generator and setting")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    print(json.dumps(measure(args.seeds), indent=2))


if __name__ == "__main__":
    main()
