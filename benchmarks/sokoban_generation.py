"""Rooms per second: our generators against gym-sokoban's, same settings, same run.

    python benchmarks/sokoban_generation.py [--seconds 2] [--room-utils PATH]

Prints JSON. Settings are the registered `sokoban` (6x6, 1 box, search_depth 300) and
`larger_sokoban` (8x8, 2 boxes, search_depth 10) configs. `ours` is the reverse-BFS
generator (`generator="reverse_bfs"`); `ragen_default` is the default generator, RAGEN-2's
algorithm (`envs.sokoban_ragen`, including its BFS for the shortest solution). Their room
difficulty is compared by scripts/sokoban_difficulty.py.

The reference is gym-sokoban's own `envs/room_utils.py` (PyPI `gym-sokoban`), loaded as a
file so that its package `__init__` (which imports old `gym`) is not needed: it only needs
numpy, so it runs in this interpreter beside ours. It is found through `--room-utils PATH`,
$GYM_SOKOBAN_ROOM_UTILS, an importable `gym_sokoban` (in any venv: `pip install gym-sokoban`),
or else fetched with `pip download --no-deps` into the ragen2 cache (~/.cache/ragen2 or
$RAGEN2_CACHE) without installing it.
Two reference numbers per setting:

- `gym_sokoban`: its `generate_room` as shipped. Its search ignores `search_depth` (the
  depth is fixed at 300) and branches over 8 actions (4 pulls, 4 walks).
- `gym_sokoban_search_depth`: the same search functions (`room_topology_generation`,
  `place_boxes_and_player`, `depth_first_search`) driven at our `search_depth`, the way
  RAGEN calls its adapted copy; the driver below repeats generate_room's 4 tries and
  reverse_playing's set-up of the module globals, nothing else.

A failed reference draw (gym raises when a room scores 0) is retried with the next seed,
as RAGEN's env does; rooms/s counts finished rooms only. Both sides build their random
state per room (numpy Generator for ours, `random.seed` + `np.random.seed` for gym).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

from envs.sokoban import VARIANTS
from envs.sokoban_generator import generate_room, num_walk_steps
from envs.sokoban_ragen import generate_ragen_room
from ragen2.bench.machine import machine_info

SETTING_VARIANTS = {"6x6_1box": "sokoban", "8x8_2box": "larger_sokoban"}
REFERENCE_VERSION = "0.0.6"


def find_reference(room_utils: str | None = None) -> tuple[Path | None, str]:
    """Path of gym-sokoban's room_utils.py, or None with the reason.

    In order: the given path (--room-utils), $GYM_SOKOBAN_ROOM_UTILS, an importable
    gym_sokoban, a copy fetched with `pip download` into the ragen2 cache.
    """
    for explicit, origin in ((room_utils, "--room-utils"),
                             (os.environ.get("GYM_SOKOBAN_ROOM_UTILS"), "$GYM_SOKOBAN_ROOM_UTILS")):
        if explicit:
            return (Path(explicit), f"from {origin}") if Path(explicit).is_file() else (
                None, f"{origin} {explicit} is not a file")
    spec = importlib.util.find_spec("gym_sokoban")  # locates the package without running its __init__
    if spec is not None and spec.submodule_search_locations:
        candidate = Path(next(iter(spec.submodule_search_locations))) / "envs" / "room_utils.py"
        if candidate.is_file():
            return candidate, "importable gym_sokoban"
    return download_reference()


def download_reference() -> tuple[Path | None, str]:
    """Fetch gym-sokoban's distribution (no dependencies, not installed) and take room_utils.py.

    Only that file is needed and it imports nothing but numpy, so the old `gym` it
    depends on never has to install.
    """
    import subprocess
    import tarfile
    import zipfile

    cache = Path(os.environ.get("RAGEN2_CACHE", Path.home() / ".cache" / "ragen2")) / "gym-sokoban"
    target = cache / "room_utils.py"
    if target.is_file():
        return target, f"downloaded gym-sokoban {REFERENCE_VERSION} (cached)"
    cache.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":none:",
               "-d", str(cache), f"gym-sokoban=={REFERENCE_VERSION}"]
    result = subprocess.run(command, capture_output=True, text=True)
    for archive in sorted(cache.iterdir()):
        name = archive.name
        if name.endswith(".whl") or name.endswith(".zip"):
            with zipfile.ZipFile(archive) as bundle:
                members = [m for m in bundle.namelist() if m.endswith("gym_sokoban/envs/room_utils.py")]
                if members:
                    target.write_bytes(bundle.read(members[0]))
        elif name.endswith(".tar.gz"):
            with tarfile.open(archive) as bundle:
                members = [m for m in bundle.getmembers() if m.name.endswith("gym_sokoban/envs/room_utils.py")]
                if members:
                    target.write_bytes(bundle.extractfile(members[0]).read())
        if target.is_file():
            return target, f"downloaded gym-sokoban {REFERENCE_VERSION} with pip download --no-deps"
    reason = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no archive"]
    return None, f"gym-sokoban not available ({reason[0]}); set $GYM_SOKOBAN_ROOM_UTILS to its room_utils.py"


def load_reference(path: Path):
    spec = importlib.util.spec_from_file_location("gym_sokoban_room_utils_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_version(path: Path) -> str | None:
    site = path.parents[2]  # …/site-packages/gym_sokoban/envs/room_utils.py
    for dist in sorted(site.glob("gym_sokoban-*.dist-info")):
        return dist.name[len("gym_sokoban-"):-len(".dist-info")]
    return None


def gym_room_at_depth(module, dim: tuple[int, int], num_steps: int, num_boxes: int, search_depth: int):
    """generate_room with the DFS depth as a parameter (gym's own functions do the work)."""
    score = 0
    for _ in range(4):  # generate_room's tries
        room = module.room_topology_generation(dim, 0.35, num_steps)
        room = module.place_boxes_and_player(room, num_boxes=num_boxes, second_player=False)
        room_structure = np.copy(room)
        room_structure[room_structure == 5] = 1
        room_state = room.copy()
        room_state[room_state == 2] = 4
        # reverse_playing's set-up of the module-level search state:
        box_mapping = {}
        rows, cols = np.where(room_structure == 2)
        for row, col in zip(rows, cols):
            box_mapping[(row, col)] = (row, col)
        module.explored_states = set()
        module.num_boxes = len(rows)
        module.best_room_score = -1
        module.best_box_mapping = box_mapping
        module.depth_first_search(room_state, room_structure, box_mapping, box_swaps=0,
                                  last_pull=(-1, -1), ttl=search_depth)
        score = module.best_room_score
        if score > 0:
            break
    if score <= 0:
        raise RuntimeWarning("Generated Model with score == 0")
    return module.best_room


def _time_rooms(make_one, seconds: float) -> dict:
    """Call make_one(seed) for seeds 0, 1, … until `seconds` pass; count finished rooms."""
    rooms = failed = 0
    seed = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        try:
            make_one(seed)
            rooms += 1
        except (RuntimeError, RuntimeWarning):
            failed += 1
        seed += 1
    elapsed = time.perf_counter() - start
    return {"rooms_per_s": round(rooms / elapsed, 2), "rooms": rooms, "failed_draws": failed,
            "seconds": round(elapsed, 3)}


def measure_ours(dim_x: int, dim_y: int, num_boxes: int, search_depth: int, seconds: float) -> dict:
    lengths, attempts = [], []

    def one(seed: int) -> None:
        room = generate_room(np.random.default_rng(seed), dim_x, dim_y, num_boxes, search_depth)
        lengths.append(len(room.solution))
        attempts.append(room.attempts)

    result = _time_rooms(one, seconds)
    result["mean_attempts"] = round(float(np.mean(attempts)), 3)
    result["mean_optimal_solution_length"] = round(float(np.mean(lengths)), 3)
    result["share_needing_over_10_actions"] = round(float(np.mean(np.array(lengths) > 10)), 4)
    return result


def measure_ragen_default(dim_x: int, dim_y: int, num_boxes: int, search_depth: int, seconds: float) -> dict:
    return _time_rooms(lambda seed: generate_ragen_room(seed, dim_x, dim_y, num_boxes, search_depth), seconds)


def measure_reference(module, dim_x: int, dim_y: int, num_boxes: int, search_depth: int | None,
                      seconds: float) -> dict:
    dim, steps = (dim_x, dim_y), num_walk_steps(dim_x, dim_y)

    def one(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed)
        if search_depth is None:
            module.generate_room(dim=dim, num_steps=steps, num_boxes=num_boxes)
        else:
            gym_room_at_depth(module, dim, steps, num_boxes, search_depth)

    return _time_rooms(one, seconds)


def measure(seconds_per_setting: float = 2.0, room_utils: str | None = None) -> dict:
    """Rooms/s of ours and of gym-sokoban's generator, for each setting; returns the JSON dict."""
    path, status = find_reference(room_utils)
    module = load_reference(path) if path is not None else None
    report = {
        "machine": machine_info(with_torch=False),
        "numpy": np.__version__,
        "seconds_per_setting": seconds_per_setting,
        "reference": {
            "available": module is not None,
            "what": "gym-sokoban's room_utils.py, unmodified, loaded as a file" if module else None,
            "path": str(path) if path else None,
            "version": reference_version(path) if path else None,
            "status": status,
        },
        "settings": {},
    }
    for label, variant in SETTING_VARIANTS.items():
        config = VARIANTS[variant].config
        args = (config.dim_x, config.dim_y, config.num_boxes)
        entry = {"variant": variant, "dim_x": config.dim_x, "dim_y": config.dim_y,
                 "num_boxes": config.num_boxes, "search_depth": config.search_depth,
                 "ours": measure_ours(*args, config.search_depth, seconds_per_setting),
                 "ragen_default": measure_ragen_default(*args, config.search_depth, seconds_per_setting)}
        if module is not None:
            shipped = measure_reference(module, *args, None, seconds_per_setting)
            shipped["note"] = "generate_room as shipped: search depth fixed at 300, pulls and walks"
            at_depth = measure_reference(module, *args, config.search_depth, seconds_per_setting)
            at_depth["note"] = f"gym's search functions driven at search_depth={config.search_depth}"
            entry["gym_sokoban"] = shipped
            entry["gym_sokoban_search_depth"] = at_depth
            ours = entry["ours"]["rooms_per_s"]
            for key in ("gym_sokoban", "gym_sokoban_search_depth"):
                theirs = entry[key]["rooms_per_s"]
                entry[f"speedup_vs_{key}"] = round(ours / theirs, 1) if theirs > 0 else None
        report["settings"][label] = entry
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="timing budget per generator and setting")
    parser.add_argument("--room-utils", metavar="PATH",
                        help="gym-sokoban's gym_sokoban/envs/room_utils.py (default: found or downloaded, see above)")
    args = parser.parse_args()
    print(json.dumps(measure(args.seconds, args.room_utils), indent=2))


if __name__ == "__main__":
    main()
