"""FrozenLake: map drawing, gymnasium's slippery dynamics, rewards, rendering, the env contract."""

import math
import subprocess
import sys
from collections import Counter

import pytest

import envs
from envs.frozen_lake import ACTIONS, FrozenLakeConfig, FrozenLakeEnv, transition_table
from envs.parsing import format_response

# A hand-built map: S at (0, 0), a hole at (1, 1), the goal at (0, 2).
SMALL_MAP = ("SFG", "FHF")
# An open map for dynamics tests; the start is placed per test.
OPEN_MAP = ("FFFF", "FHFF", "FFFG")


def act(env, *actions):
    return env.step(format_response(list(actions), think="go"))


def small_lake(**overrides):
    env = FrozenLakeEnv(FrozenLakeConfig(fixed_map=SMALL_MAP, success_rate=1.0, **overrides))
    env.reset(seed=0)
    return env


def with_start(rows, position):
    r, c = position
    return tuple(row[:c] + "S" + row[c + 1:] if i == r else row for i, row in enumerate(rows))


def reachable(rows) -> bool:
    """Flood fill from S through non-hole tiles, written apart from the env's own search."""
    cells = {(r, c): tile for r, row in enumerate(rows) for c, tile in enumerate(row)}
    todo = [pos for pos, tile in cells.items() if tile == "S"]
    seen = set(todo)
    while todo:
        r, c = todo.pop()
        for nxt in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if nxt in cells and nxt not in seen and cells[nxt] != "H":
                seen.add(nxt)
                todo.append(nxt)
    return any(cells[pos] == "G" for pos in seen)


@pytest.mark.parametrize("name", ["frozen_lake", "frozen_lake_coord"])
def test_registered_variant_passes_the_checker(name):
    envs.check_env(lambda: envs.make(name))


def test_registered_defaults():
    grid, coord = envs.make("FrozenLake").config, envs.make("CoordFrozenLake").config
    assert (grid.size, grid.p, grid.success_rate, grid.observation_format) == (4, 0.9, 0.8, "grid")
    # RAGEN-2 @20daedc: base.yaml agent_proxy.max_actions_per_turn = 2, envs.yaml max_actions_per_traj = 10
    assert (grid.max_actions_per_traj, grid.max_actions_per_turn) == (10, 2)
    assert coord == FrozenLakeConfig(observation_format="grid_coord")
    assert envs.make("frozen_lake", success_rate=1.0, size=6).config.size == 6


@pytest.mark.parametrize("size, p", [(2, 0.5), (4, 0.9), (4, 0.3), (6, 0.6), (8, 0.8)])
def test_drawn_maps_are_valid_and_always_have_a_path(size, p):
    env = FrozenLakeEnv(FrozenLakeConfig(size=size, p=p))
    maps = set()
    for seed in range(40):
        env.reset(seed=seed)
        rows = env.map
        assert len(rows) == size and all(len(row) == size for row in rows)
        text = "".join(rows)
        assert text.count("S") == 1 and text.count("G") == 1 and set(text) <= set("SFHG")
        assert reachable(rows), rows
        maps.add(rows)
    assert len(maps) >= 20  # seeds give varied maps (start and goal move too)


def test_map_depends_only_on_the_seed_even_in_another_process():
    env = FrozenLakeEnv()
    ours = [env.reset(seed=seed)[1]["map"] for seed in (0, 99, 2**40)]
    code = (
        "from envs.frozen_lake import FrozenLakeEnv; e = FrozenLakeEnv(); "
        "print([e.reset(seed=s)[1]['map'] for s in (0, 99, 2**40)])"
    )
    theirs = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={"PYTHONHASHSEED": "12345", "PATH": ""}, cwd=envs.__path__[0] + "/..")
    assert theirs.stdout.strip() == str(ours)


def test_gymnasium_table_is_ragens_success_rate_mapping():
    """Hand-computed: the intended move with success_rate, each perpendicular one with the rest / 2."""
    table = transition_table(with_start(OPEN_MAP, (0, 1)), 0.8)
    down_from_01 = {(next_state, round(prob, 9)) for prob, next_state, _, _ in table[1][ACTIONS.index("Down")]}
    assert down_from_01 == {(5, 0.8), (0, 0.1), (2, 0.1)}  # hole below, slips left / right
    hole = table[5][0]
    assert hole == [(1.0, 5, 0, True)]  # holes (and the goal) absorb


def empirical_next_positions(rows, start, action, success_rate, draws):
    env = FrozenLakeEnv(FrozenLakeConfig(fixed_map=with_start(rows, start), success_rate=success_rate))
    counts = Counter()
    for rollout_index in range(draws):
        env.reset(seed=0, options={"rollout_index": rollout_index})
        act(env, action)
        counts[env.player_position] += 1
    return counts


@pytest.mark.parametrize("start, action, success_rate, expected", [
    ((0, 1), "Down", 0.8, {(1, 1): 0.8, (0, 0): 0.1, (0, 2): 0.1}),   # into the hole or sideways
    ((0, 0), "Left", 0.8, {(0, 0): 0.9, (1, 0): 0.1}),                # wall: Left and the Up slip stay put
    ((2, 2), "Right", 0.8, {(2, 3): 0.8, (1, 2): 0.1, (2, 2): 0.1}),  # onto the goal
    ((1, 3), "Up", 0.5, {(0, 3): 0.5, (1, 2): 0.25, (1, 3): 0.25}),
    ((1, 2), "Left", 0.0, {(0, 2): 0.5, (2, 2): 0.5}),                # success_rate 0: always a slip
])
def test_transition_frequencies_match_gymnasiums_table(start, action, success_rate, expected):
    rows = with_start(OPEN_MAP, start)
    n_cols = len(rows[0])
    table = Counter()
    for prob, next_state, _, _ in transition_table(rows, success_rate)[start[0] * n_cols + start[1]][
            ACTIONS.index(action)]:
        if prob > 0:
            table[divmod(next_state, n_cols)] += prob
    assert {pos: round(prob, 9) for pos, prob in table.items()} == expected  # gymnasium agrees with hand values

    draws = 3000
    counts = empirical_next_positions(OPEN_MAP, start, action, success_rate, draws)
    assert set(counts) <= set(expected)
    for position, prob in expected.items():
        tolerance = 4.5 * math.sqrt(prob * (1 - prob) / draws)  # 4.5 binomial std
        assert abs(counts[position] / draws - prob) <= tolerance, (position, counts[position], prob)


def test_success_rate_one_is_deterministic():
    env = FrozenLakeEnv(FrozenLakeConfig(success_rate=1.0, max_actions_per_turn=10))
    plan = ["Right", "Down", "Down", "Left", "Up", "Right", "Right", "Down", "Left", "Down"]
    for seed in range(10):
        transcripts = set()
        for rollout_index in range(8):
            env.reset(seed=seed, options={"rollout_index": rollout_index})
            obs, reward, terminated, truncated, info = act(env, *plan)
            transcripts.add((obs, reward, terminated, truncated, tuple(info["actions_executed"])))
        assert len(transcripts) == 1
    lake = FrozenLakeEnv(FrozenLakeConfig(fixed_map=("SFF", "FFF", "FFG"), success_rate=1.0))
    lake.reset(seed=0)
    for action, position in [("Right", (0, 1)), ("Down", (1, 1)), ("Left", (1, 0)), ("Up", (0, 0))]:
        act(lake, action)
        assert lake.player_position == position


def test_slippery_rollouts_of_a_group_differ():
    env = envs.make("frozen_lake")
    outcomes = set()
    for rollout_index in range(16):
        env.reset(seed=4, options={"rollout_index": rollout_index})
        outcomes.add(act(env, "Right", "Right", "Down", "Down", "Left")[0])
    assert len(outcomes) > 1


def test_reaching_the_goal_pays_one_and_ends_in_success():
    env = small_lake()
    assert env.render() == "P_G\n_O_"
    obs, reward, terminated, truncated, info = act(env, "Right", "Right", "Left")
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert info["actions_executed"] == ["Right", "Right"]  # the move after the goal is not played
    assert obs == "__√\n_O_"


def test_falling_in_a_hole_ends_without_reward_or_success():
    env = small_lake()
    obs, reward, terminated, truncated, info = act(env, "Down")
    assert (reward, terminated, obs) == (0.0, False, "__G\nPO_")
    obs, reward, terminated, truncated, info = act(env, "Right")
    assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)
    assert obs == "__G\n_X_"


def test_bumping_a_wall_is_a_valid_ineffective_move_and_the_budget_truncates():
    env = small_lake()
    obs, reward, terminated, truncated, info = act(env, "Left", "Up")
    assert (obs, reward, terminated, truncated) == ("P_G\n_O_", 0.0, False, False)
    assert [i["action_is_effective"] for i in info["action_infos"]] == [False, False]
    for _ in range(4):  # 2 + 4 x 2 = the budget of 10 (2 actions per turn, RAGEN-2's default)
        obs, reward, terminated, truncated, info = act(env, "Left", "Up")
    assert (terminated, truncated, info["success"], env.actions_left) == (False, True, False, 0)


def test_coordinate_observations():
    env = small_lake(observation_format="coord")
    assert env.render() == (
        "Board size: 2 rows x 3 cols (zero-indexed).\nStart: (0, 0)\nGoal: (0, 2)\nPlayer: (0, 0)\nHoles: (1, 1)"
    )
    act(env, "Down", "Right")
    assert env.render().splitlines()[3] == "Player in hole: (1, 1)"
    both = small_lake(observation_format="grid_coord")
    act(both, "Right", "Right")
    assert both.render() == (
        "Coordinates:\nBoard size: 2 rows x 3 cols (zero-indexed).\nStart: (0, 0)\nGoal: (0, 2)\n"
        "Player on goal: (0, 2)\nHoles: (1, 1)\nGrid map:\n__√\n_O_"
    )
    assert "to (1, 2) at the bottom-right" in both.instruction


def test_instruction_mentions_slipping_only_when_moves_can_slip():
    assert "slippery" in envs.make("frozen_lake").instruction
    assert "slippery" not in envs.make("frozen_lake", success_rate=1.0).instruction


@pytest.mark.parametrize("overrides, message", [
    ({"size": 1}, "size must be an int in"),
    ({"size": 100}, "size must be an int in"),
    ({"p": 0.0}, "p .* must be in"),
    ({"p": 1.5}, "p .* must be in"),
    ({"success_rate": -0.1}, "success_rate must be in"),
    ({"observation_format": "image"}, "observation_format must be one of"),
    ({"fixed_map": ("SFX", "FFG")}, "may only contain"),
    ({"fixed_map": ("SFS", "FFG")}, "exactly one S and one G"),
    ({"fixed_map": ("SF", "FFG")}, "equal length"),
])
def test_bad_config_is_a_specific_error(overrides, message):
    with pytest.raises(envs.EnvConfigError, match=message):
        envs.make("frozen_lake", **overrides)


def test_a_map_given_as_a_list_or_string_is_handled():
    env = FrozenLakeEnv(FrozenLakeConfig(fixed_map=["SFG", "FHF"], success_rate=1.0))
    assert env.reset(seed=1)[0] == "P_G\n_O_"
    with pytest.raises(envs.EnvConfigError, match="rows must be strings"):
        FrozenLakeConfig(fixed_map="SFG")
