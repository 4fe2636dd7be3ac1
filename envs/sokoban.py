"""Sokoban: push every box onto a target (RAGEN's SimpleSokoban and its variants).

Rooms (`generator`): "ragen" (default) is RAGEN-2's generator (`envs.sokoban_ragen`): the
same rooms for the same seed, 6x6 / 1 box averaging 3.98 moves to solve with 0.2% needing
more than the 10-action budget. "reverse_bfs" is our breadth-first reverse-play generator
(`envs.sokoban_generator`): every room is solvable within `search_depth` actions and comes
with an optimal solution, but rooms are harder (5.8 moves, 9% over the budget): it takes
the best-scoring state among all states within `search_depth`, where RAGEN-2 takes the first
best one its depth-first search meets (scripts/sokoban_difficulty.py prints both). Rewards follow gym-sokoban, which RAGEN uses:
-0.1 per action, +1 for pushing a box onto a target, -1 for pushing one off, +10 when every
box is on a target (the episode then terminates with success). Moving into a wall, or into
a box that cannot move, is a no-op that still costs the step penalty.

Observations are the grid in symbols (default `# _ O X √ P S`), a coordinate listing, or
both (`observation_format`: grid | coord | grid_coord).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.base import ActionOutcome, EnvConfig, EnvConfigError, TextEnv
from envs import ragen_text
from envs.registry import EnvSpec, register
from envs.sokoban_generator import DIRECTION_STEPS, FLOOR, TARGET, WALL, generate_room
from envs.sokoban_ragen import generate_ragen_room

ACTIONS = ("Up", "Down", "Left", "Right")  # same order as DIRECTION_STEPS
STEP_PENALTY = -0.1
BOX_ON_TARGET_REWARD = 1.0
BOX_OFF_TARGET_PENALTY = -1.0
SOLVED_REWARD = 10.0

# Symbol order in `SokobanConfig.symbols`, and what each one means in the instruction.
SYMBOL_MEANINGS = ("wall", "empty", "target", "box", "box on target", "player", "player on target")
DEFAULT_SYMBOLS = "#_OX√PS"
RAGEN_ALT_SYMBOLS = "W.GBCA@"  # RAGEN's SokobanDifferentGridVocab
OBSERVATION_FORMATS = ("grid", "coord", "grid_coord")
MIN_DIM, MAX_DIM = 5, 16  # 5: the smallest interior (3x3) where a box can be pulled; 16: keeps text short
MAX_SEARCH_DEPTH = 1000
MAX_BOXES = 4
GENERATORS = ("ragen", "reverse_bfs")

INSTRUCTION = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes onto targets. "
    "When you are right next to a box, you can push it by moving in the same direction. "
    "You cannot push a box into a wall or into another box, and you cannot pull a box. "
    "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>"
)


@dataclass(frozen=True)
class SokobanConfig(EnvConfig):
    max_actions_per_turn: int = 2   # RAGEN-2 base.yaml agent_proxy.max_actions_per_turn (Sokoban keeps it)
    max_actions_per_traj: int = 10
    dim_x: int = 6                  # rows (RAGEN's dim_room[0])
    dim_y: int = 6                  # columns
    num_boxes: int = 1
    search_depth: int = 300         # reverse-play depth (RAGEN-2's default); reverse_bfs: a bound on the solution
    generator: str = "ragen"        # ragen (RAGEN-2's rooms) | reverse_bfs (ours, harder); see GENERATORS
    observation_format: str = "grid"
    # One character each for: wall, empty, target, box, box on target, player, player on target.
    symbols: str = DEFAULT_SYMBOLS

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("dim_x", "dim_y", "num_boxes", "search_depth"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise EnvConfigError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        for name in ("observation_format", "symbols", "generator"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise EnvConfigError(f"{name} must be a str, got {type(value).__name__} {value!r}")
        for name in ("dim_x", "dim_y"):
            value = getattr(self, name)
            if not MIN_DIM <= value <= MAX_DIM:
                raise EnvConfigError(f"{name} must be in [{MIN_DIM}, {MAX_DIM}], got {value}")
        # The carved floor rarely leaves room to pull more boxes than a fifth of the interior
        # (or than MAX_BOXES in any room) off their targets; generation then fails or takes seconds.
        max_boxes = min(MAX_BOXES, max(1, (self.dim_x - 2) * (self.dim_y - 2) // 5))
        if not 1 <= self.num_boxes <= max_boxes:
            raise EnvConfigError(
                f"num_boxes must be in [1, {max_boxes}] for a {self.dim_x}x{self.dim_y} room, got {self.num_boxes}"
            )
        if not self.num_boxes <= self.search_depth <= MAX_SEARCH_DEPTH:
            # Each box needs at least one reverse pull to leave its target.
            raise EnvConfigError(
                f"search_depth must be in [num_boxes={self.num_boxes}, {MAX_SEARCH_DEPTH}], got {self.search_depth}"
            )
        if self.generator not in GENERATORS:
            raise EnvConfigError(f"generator must be one of {list(GENERATORS)}, got {self.generator!r}")
        if self.generator == "ragen" and self.search_depth < self.num_boxes + 2:
            # RAGEN's search scores a state d moves deep only while d <= search_depth - 2.
            raise EnvConfigError(f"generator='ragen' needs search_depth >= num_boxes + 2 = {self.num_boxes + 2}, "
                                 f"got {self.search_depth}")
        if self.observation_format not in OBSERVATION_FORMATS:
            raise EnvConfigError(
                f"observation_format must be one of {list(OBSERVATION_FORMATS)}, got {self.observation_format!r}"
            )
        symbols = self.symbols
        if len(symbols) != len(SYMBOL_MEANINGS):
            raise EnvConfigError(
                f"symbols must be a string of {len(SYMBOL_MEANINGS)} characters "
                f"({', '.join(SYMBOL_MEANINGS)}), got {symbols!r}"
            )
        if len(set(symbols)) != len(symbols) or any(ch.isspace() for ch in symbols):
            raise EnvConfigError(f"symbols must be distinct and not whitespace, got {symbols!r}")


class SokobanEnv(TextEnv):
    config_cls = SokobanConfig

    def __init__(self, config: SokobanConfig | None = None):
        super().__init__(config)
        self.dim_x, self.dim_y = self.config.dim_x, self.config.dim_y
        self.fixed: list[int] = []        # WALL / FLOOR / TARGET per flat cell (row * dim_y + col)
        self.boxes: set[int] = set()
        self.player = 0
        self.solution: tuple[str, ...] = ()  # a shortest solution from the start (empty after load_room)

    # --- instruction and actions ----------------------------------------------------------

    @property
    def ragen_instruction(self) -> str:
        # RAGEN-2 appends the default symbol list to every variant (it reads the default config)
        text = ragen_text.SOKOBAN if self.config.observation_format == "grid" else ragen_text.COORD_SOKOBAN
        return text + ragen_text.SOKOBAN_VOCAB

    @property
    def ragen_actions(self) -> tuple[str, ...]:
        return ragen_text.SOKOBAN_ACTIONS

    @property
    def ragen_max_words(self) -> int:
        return ragen_text.MAX_TOKENS if self.config.observation_format == "grid" else ragen_text.COORD_MAX_TOKENS

    @property
    def instruction(self) -> str:
        text = INSTRUCTION
        if self.config.observation_format != "grid":
            text += (
                f"\nPositions are zero-indexed (row, column) pairs, from (0, 0) at the top-left to "
                f"({self.config.dim_x - 1}, {self.config.dim_y - 1}) at the bottom-right; "
                "Up decreases the row and Left decreases the column."
            )
        if self.config.observation_format != "coord":
            meanings = ", ".join(f"{s}: {m}" for s, m in zip(self.config.symbols, SYMBOL_MEANINGS))
            text += "\nThe meaning of each symbol in the state is:\n" + meanings
        return text

    @property
    def action_vocabulary(self) -> tuple[str, ...]:
        return ACTIONS

    # --- game -----------------------------------------------------------------------------

    def _reset(self, rng: np.random.Generator) -> dict:
        config = self.config
        if config.generator == "ragen":  # seeded from the env seed as RAGEN-2 seeds it, not from rng
            room = generate_ragen_room(self.seed, config.dim_x, config.dim_y, config.num_boxes, config.search_depth)
        else:
            room = generate_room(rng, config.dim_x, config.dim_y, config.num_boxes, config.search_depth)
        self.dim_x, self.dim_y = room.dim_x, room.dim_y  # load_room may have changed them
        self.fixed = list(room.fixed)
        self.boxes = set(room.boxes)
        self.player = room.player
        self.solution = tuple(ACTIONS[d] for d in room.solution)
        return {"generation_attempts": room.attempts, "reference_solution_length": len(room.solution)}

    def load_room(self, rows: list[str] | str) -> None:
        """Start an episode from a hand-written room in this config's symbols (tests, curricula).

        The room must be rectangular with a wall border, one player, and at least one box,
        with as many boxes as targets. Raises ValueError naming the first problem.
        """
        if isinstance(rows, str):
            rows = rows.strip("\n").split("\n")
        if not rows or any(len(row) != len(rows[0]) for row in rows):
            raise ValueError("a room must be a non-empty rectangle of rows of equal length")
        code = {symbol: index for index, symbol in enumerate(self.config.symbols)}
        wall, empty, target, box, box_on_target, player, player_on_target = range(7)
        fixed, boxes, players = [], set(), []
        width = len(rows[0])
        for r, row in enumerate(rows):
            for c, symbol in enumerate(row):
                if symbol not in code:
                    raise ValueError(f"unknown symbol {symbol!r} at ({r}, {c}); symbols are {self.config.symbols!r}")
                kind = code[symbol]
                cell = r * width + c
                fixed.append(WALL if kind == wall else TARGET if kind in (target, box_on_target, player_on_target)
                             else FLOOR)
                if kind in (box, box_on_target):
                    boxes.add(cell)
                if kind in (player, player_on_target):
                    players.append(cell)
                border = r in (0, len(rows) - 1) or c in (0, width - 1)
                if border and kind != wall:
                    raise ValueError(f"the border must be wall, found {symbol!r} at ({r}, {c})")
        if len(players) != 1:
            raise ValueError(f"a room needs exactly one player, found {len(players)}")
        num_targets = sum(kind == TARGET for kind in fixed)
        if not boxes or len(boxes) != num_targets:
            raise ValueError(f"a room needs at least one box and as many targets as boxes, "
                             f"found {len(boxes)} box(es) and {num_targets} target(s)")
        self.dim_x, self.dim_y = len(rows), width
        self.fixed, self.boxes, self.player = fixed, boxes, players[0]
        self.solution = ()
        self.actions_taken, self.episode_over = 0, False

    def _boxes_on_target(self) -> int:
        return sum(self.fixed[cell] == TARGET for cell in self.boxes)

    def _apply_action(self, action: str) -> ActionOutcome:
        d_row, d_col = DIRECTION_STEPS[ACTIONS.index(action)]
        step = d_row * self.dim_y + d_col
        before = self._boxes_on_target()
        # The wall border means a step from the interior never leaves the grid.
        next_cell = self.player + step
        moved = pushed = False
        if self.fixed[next_cell] != WALL:
            if next_cell not in self.boxes:
                moved = True
            else:
                beyond = next_cell + step
                if self.fixed[beyond] != WALL and beyond not in self.boxes:
                    self.boxes.remove(next_cell)
                    self.boxes.add(beyond)
                    moved = pushed = True
        if moved:
            self.player = next_cell
        after = self._boxes_on_target()
        reward = STEP_PENALTY
        if after > before:
            reward += BOX_ON_TARGET_REWARD
        elif after < before:
            reward += BOX_OFF_TARGET_PENALTY
        solved = after == len(self.boxes)
        if solved:
            reward += SOLVED_REWARD
        info = {"action_is_effective": moved, "pushed_box": pushed, "boxes_on_target": after}
        return ActionOutcome(reward=reward, terminated=solved, success=solved, info=info)

    # --- observation ----------------------------------------------------------------------

    def _cell_symbols(self) -> list[str]:
        wall, empty, target, box, box_on_target, player, player_on_target = self.config.symbols
        cells = [wall if kind == WALL else target if kind == TARGET else empty for kind in self.fixed]
        for cell in self.boxes:
            cells[cell] = box_on_target if self.fixed[cell] == TARGET else box
        cells[self.player] = player_on_target if self.fixed[self.player] == TARGET else player
        return cells

    def render_grid(self) -> str:
        cells = self._cell_symbols()
        return "\n".join("".join(cells[r * self.dim_y:(r + 1) * self.dim_y]) for r in range(self.dim_x))

    def render_coordinates(self) -> str:
        def where(cells) -> str:
            listed = ", ".join(f"({cell // self.dim_y}, {cell % self.dim_y})" for cell in sorted(cells))
            return listed or "none"

        border = {r * self.dim_y + c for r in range(self.dim_x) for c in range(self.dim_y)
                  if r in (0, self.dim_x - 1) or c in (0, self.dim_y - 1)}
        # The border is always wall; listing only the inner walls keeps the text short.
        inner_walls = [cell for cell, kind in enumerate(self.fixed) if kind == WALL and cell not in border]
        targets = [cell for cell, kind in enumerate(self.fixed) if kind == TARGET]
        player_note = " (on a target)" if self.fixed[self.player] == TARGET else ""
        return "\n".join((
            f"Board size: {self.dim_x} rows x {self.dim_y} columns, zero-indexed (row, column); "
            "the outer border is wall.",
            f"Inner walls: {where(inner_walls)}",
            f"Targets: {where(targets)}",
            f"Boxes: {where(b for b in self.boxes if self.fixed[b] != TARGET)}",
            f"Boxes on target: {where(b for b in self.boxes if self.fixed[b] == TARGET)}",
            f"Player: {where([self.player])}{player_note}",
        ))

    def render(self) -> str:
        if not self.fixed:
            return "(no room: call reset() first)"
        observation_format = self.config.observation_format
        if observation_format == "grid":
            return self.render_grid()
        if observation_format == "coord":
            return self.render_coordinates()
        return f"Coordinates:\n{self.render_coordinates()}\nGrid map:\n{self.render_grid()}"


def _register_variants() -> dict[str, EnvSpec]:
    variants = {}
    for name, config, description, aliases in (
        ("sokoban", SokobanConfig(), "Sokoban 6x6, 1 box (RAGEN SimpleSokoban)", ("simple_sokoban",)),
        ("larger_sokoban", SokobanConfig(dim_x=8, dim_y=8, num_boxes=2, search_depth=10),
         "Sokoban 8x8, 2 boxes, reverse-play search depth 10 (RAGEN LargerSokoban)", ()),
        ("sokoban_different_grid_vocab", SokobanConfig(search_depth=30, symbols=RAGEN_ALT_SYMBOLS),
         "Sokoban 6x6, 1 box, drawn with other symbols (W . G B C A @)", ()),
        ("sokoban_coord", SokobanConfig(observation_format="grid_coord"),
         "Sokoban 6x6, 1 box, observed as coordinate lists plus the grid (RAGEN CoordSokoban)",
         ("coord_sokoban",)),
    ):
        variants[name] = register(name, SokobanEnv, config, description, aliases=aliases)
    return variants


VARIANTS = _register_variants()
