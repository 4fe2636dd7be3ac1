"""FrozenLake: walk from the start to the goal across slippery ice without falling in a hole.

The map is drawn per seed (RAGEN's generator semantics: each tile frozen with probability
`p`, start and goal at random distinct tiles, redrawn until the goal is reachable from the
start). The dynamics are gymnasium's `FrozenLakeEnv` transition table `P`: with
probability `success_rate` the intended move happens, otherwise one of the two
perpendicular moves, each with probability (1 - success_rate) / 2 — exactly how RAGEN
passes its `success_rate` to gymnasium. Moves are sampled from `self.dynamics_rng`.

Observations (RAGEN's symbols): P player, _ frozen, O hole, G goal, X player in hole,
√ player on goal. `observation_format` "coord" lists coordinates instead, "grid_coord" both.
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass

import numpy as np
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLakeEnv
from gymnasium.envs.toy_text.utils import categorical_sample

from envs.base import ActionOutcome, EnvConfig, EnvConfigError, TextEnv
from envs import ragen_text
from envs.registry import register

# Our action names in gymnasium's action order (LEFT=0, DOWN=1, RIGHT=2, UP=3).
ACTIONS = ("Left", "Down", "Right", "Up")
OBSERVATION_FORMATS = ("grid", "coord", "grid_coord")
MAP_TILES = "SFHG"  # start, frozen, hole, goal: gymnasium's map letters
MAX_SIZE = 32  # map drawing is O(size^4) in the worst case; larger boards are not a use case
TILE_SYMBOLS = {"S": "_", "F": "_", "H": "O", "G": "G"}  # the start is plain ice once left
PLAYER_SYMBOLS = {"S": "P", "F": "P", "H": "X", "G": "√"}
SYMBOL_LEGEND = "P: player, _: frozen ice, O: hole, G: goal, X: player in a hole, √: player on the goal"


@dataclass(frozen=True)
class FrozenLakeConfig(EnvConfig):
    max_actions_per_turn: int = 2  # RAGEN-2 base.yaml agent_proxy.max_actions_per_turn
    max_actions_per_traj: int = 10
    size: int = 4  # the drawn map is size x size
    p: float = 0.9  # probability that a drawn tile is frozen (RAGEN's current default)
    success_rate: float = 0.8  # probability that the intended move happens; 1.0 = deterministic
    observation_format: str = "grid"
    fixed_map: tuple[str, ...] = ()  # rows of S/F/H/G; when given, used for every seed (size, p ignored)

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or not 2 <= self.size <= MAX_SIZE:
            raise EnvConfigError(f"size must be an int in [2, {MAX_SIZE}], got {self.size!r}")
        if not (0.0 < self.p <= 1.0):
            raise EnvConfigError(f"p (the probability a tile is frozen) must be in (0, 1], got {self.p}")
        if not (0.0 <= self.success_rate <= 1.0):
            raise EnvConfigError(f"success_rate must be in [0, 1], got {self.success_rate}")
        if self.observation_format not in OBSERVATION_FORMATS:
            raise EnvConfigError(
                f"observation_format must be one of {list(OBSERVATION_FORMATS)}, got {self.observation_format!r}"
            )
        if self.fixed_map:
            validate_map(self.fixed_map)
            # A tuple, so the map can key the transition-table cache even when given as a list.
            object.__setattr__(self, "fixed_map", tuple(self.fixed_map))
        super().__post_init__()


def validate_map(rows: tuple[str, ...] | list[str]) -> None:
    """Raise EnvConfigError unless `rows` is a rectangular S/F/H/G map with one start and one goal."""
    if isinstance(rows, str) or not all(isinstance(row, str) for row in rows):
        raise EnvConfigError(f"fixed_map rows must be strings, got {list(rows)!r}")
    if len({len(row) for row in rows}) != 1 or not rows[0]:
        raise EnvConfigError(f"fixed_map rows must be non-empty and of equal length, got {list(rows)!r}")
    bad = sorted(set("".join(rows)) - set(MAP_TILES))
    if bad:
        raise EnvConfigError(f"fixed_map may only contain {list(MAP_TILES)}, found {bad}")
    text = "".join(rows)
    if text.count("S") != 1 or text.count("G") != 1:
        raise EnvConfigError(
            f"fixed_map needs exactly one S and one G, found {text.count('S')} S and {text.count('G')} G"
        )


def goal_reachable(rows: list[str] | tuple[str, ...]) -> bool:
    """Breadth-first search from S over non-hole tiles (4-neighbourhood) to G."""
    n_rows, n_cols = len(rows), len(rows[0])
    start = next((r, c) for r in range(n_rows) for c in range(n_cols) if rows[r][c] == "S")
    seen, frontier = {start}, deque([start])
    while frontier:
        r, c = frontier.popleft()
        if rows[r][c] == "G":
            return True
        for dr, dc in ((1, 0), (0, 1), (-1, 0), (0, -1)):
            nr, nc = r + dr, c + dc
            if 0 <= nr < n_rows and 0 <= nc < n_cols and (nr, nc) not in seen and rows[nr][nc] != "H":
                seen.add((nr, nc))
                frontier.append((nr, nc))
    return False


def draw_map(rng: np.random.Generator, size: int, p: float) -> tuple[str, ...]:
    """A random size x size map with a start-to-goal path, drawn only from `rng`.

    Our own drawer rather than gymnasium's `generate_random_map`: that one seeds its own
    generator and pins S and G to the corners, while RAGEN places both at random. Every
    attempt succeeds when S and G are adjacent, so the expected number of attempts is at
    most size * (size + 1) / 4 even for tiny p.
    """
    while True:
        frozen = rng.random((size, size)) < p
        board = [["F" if is_frozen else "H" for is_frozen in row] for row in frozen]
        start = tuple(int(x) for x in rng.integers(size, size=2))
        goal = tuple(int(x) for x in rng.integers(size, size=2))
        if start == goal:
            continue
        board[start[0]][start[1]] = "S"
        board[goal[0]][goal[1]] = "G"
        rows = tuple("".join(row) for row in board)
        if goal_reachable(rows):
            return rows


@functools.lru_cache(maxsize=4096)
def transition_table(rows: tuple[str, ...], success_rate: float) -> dict:
    """gymnasium's P[state][action] = [(prob, next_state, reward, terminated), ...] for this map.

    Cached: G rollouts of a group (and fixed maps) share one table; it is never mutated.
    """
    gym_env = GymFrozenLakeEnv(desc=list(rows), is_slippery=True, success_rate=success_rate)
    return gym_env.P


class FrozenLakeEnv(TextEnv):
    config_cls = FrozenLakeConfig
    config: FrozenLakeConfig

    def __init__(self, config: FrozenLakeConfig | None = None):
        super().__init__(config)
        self.map: tuple[str, ...] = ()
        self.state = 0  # gymnasium's state index: row * n_cols + col

    @property
    def ragen_instruction(self) -> str:
        text = ragen_text.FROZEN_LAKE if self.config.observation_format == "grid" else ragen_text.COORD_FROZEN_LAKE
        return text + ragen_text.FROZEN_LAKE_VOCAB

    @property
    def ragen_actions(self) -> tuple[str, ...]:
        return ragen_text.FROZEN_LAKE_ACTIONS

    @property
    def ragen_max_words(self) -> int:
        return ragen_text.MAX_TOKENS if self.config.observation_format == "grid" else ragen_text.COORD_MAX_TOKENS

    @property
    def instruction(self) -> str:
        config = self.config
        text = "You are solving the FrozenLake puzzle. Reach the goal without falling into a hole."
        if config.success_rate < 1.0:
            text += (
                " The ice is slippery: a move may go in a direction perpendicular to the one you chose."
            )
        if config.observation_format in ("grid", "grid_coord"):
            text += f"\nThe grid symbols are {SYMBOL_LEGEND}."
        if config.observation_format in ("coord", "grid_coord"):
            rows, cols = self.shape
            text += (
                f"\nCoordinates are zero-indexed (row, column), from (0, 0) at the top-left corner"
                f" to ({rows - 1}, {cols - 1}) at the bottom-right corner; Down increases the row."
            )
        text += " Example answer: <answer>Left || Up</answer>."
        return text

    @property
    def action_vocabulary(self) -> tuple[str, ...]:
        return ACTIONS

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols) of the current map, or of the configured one before the first reset."""
        rows = self.map or self.config.fixed_map
        if rows:
            return len(rows), len(rows[0])
        return self.config.size, self.config.size

    @property
    def player_position(self) -> tuple[int, int]:
        return divmod(self.state, self.shape[1])

    def tile(self, row: int, col: int) -> str:
        return self.map[row][col]

    def _reset(self, rng: np.random.Generator) -> dict:
        config = self.config
        self.map = config.fixed_map or draw_map(rng, config.size, config.p)
        text = "".join(self.map)
        self.state = text.index("S")
        return {"map": list(self.map)}

    def _apply_action(self, action: str) -> ActionOutcome:
        transitions = transition_table(self.map, float(self.config.success_rate))[self.state][ACTIONS.index(action)]
        chosen = categorical_sample([t[0] for t in transitions], self.dynamics_rng)
        _, next_state, reward, terminated = transitions[chosen]
        before = self.player_position
        self.state = int(next_state)
        after = self.player_position
        info = {"action": action, "from": before, "to": after, "action_is_effective": before != after}
        success = bool(terminated) and self.tile(*after) == "G"
        return ActionOutcome(reward=float(reward), terminated=bool(terminated), success=success, info=info)

    def render(self) -> str:
        if not self.map:
            return "(no map yet: call reset())"
        fmt = self.config.observation_format
        if fmt == "grid":
            return self.render_grid()
        if fmt == "coord":
            return self.render_coordinates()
        return f"Coordinates:\n{self.render_coordinates()}\nGrid map:\n{self.render_grid()}"

    def render_grid(self) -> str:
        player = self.player_position
        lines = []
        for r, row in enumerate(self.map):
            lines.append("".join(
                PLAYER_SYMBOLS[tile] if (r, c) == player else TILE_SYMBOLS[tile] for c, tile in enumerate(row)
            ))
        return "\n".join(lines)

    def render_coordinates(self) -> str:
        rows, cols = self.shape
        cells = [(r, c) for r in range(rows) for c in range(cols)]

        def where(letter: str) -> str:
            return ", ".join(f"({r}, {c})" for r, c in cells if self.tile(r, c) == letter)

        player = self.player_position
        under_player = self.tile(*player)
        player_label = {"G": "Player on goal", "H": "Player in hole"}.get(under_player, "Player")
        lines = [
            f"Board size: {rows} rows x {cols} cols (zero-indexed).",
            f"Start: {where('S')}",
            f"Goal: {where('G')}",
            f"{player_label}: ({player[0]}, {player[1]})",
        ]
        holes = where("H")
        if holes:
            lines.append(f"Holes: {holes}")
        return "\n".join(lines)


register("frozen_lake", FrozenLakeEnv, FrozenLakeConfig(),
         "FrozenLake on a random 4x4 map with slippery ice (success_rate 0.8), symbol-grid observations")
register("frozen_lake_coord", FrozenLakeEnv, FrozenLakeConfig(observation_format="grid_coord"),
         "FrozenLake with coordinate lists beside the symbol grid (RAGEN's CoordFrozenLake)",
         aliases=("CoordFrozenLake",))
