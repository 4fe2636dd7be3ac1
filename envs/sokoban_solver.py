"""Shortest Sokoban solutions by breadth-first search over (player, box cells) states.

Used to measure room difficulty (scripts/sokoban_difficulty.py) and to give rooms whose
generator does not know its shortest solution (RAGEN-2's) a reference solution. Cells are
flat row-major indices (cell = row * dim_y + col) and the room has a wall border, so a step
from a floor cell never leaves the grid. Moves are tried Up, Down, Left, Right, the action
order everywhere, so the solution returned is the first shortest one in that order.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

from envs.sokoban_generator import TARGET, WALL

MAX_SOLVER_STATES = 200_000  # a 6x6 room has a few hundred states; this bounds pathological rooms


def shortest_solution(fixed: Sequence[int], dim_y: int, boxes, player: int,
                      max_depth: int | None = None, max_states: int = MAX_SOLVER_STATES) -> tuple[int, ...] | None:
    """Direction indices (0 Up, 1 Down, 2 Left, 3 Right) of a shortest solution, or None when
    there is none within `max_depth` moves (or the search passed `max_states` states)."""
    targets = 0
    for cell, kind in enumerate(fixed):
        if kind == TARGET:
            targets |= 1 << cell
    start_boxes = 0
    for cell in boxes:
        start_boxes |= 1 << cell
    if start_boxes == targets:
        return ()
    offsets = (-dim_y, dim_y, -1, 1)
    open_cell = [kind != WALL for kind in fixed]
    shift = len(fixed)
    start = start_boxes << shift | player
    parents = {start: (-1, -1)}
    frontier = deque([(player, start_boxes, 0)])
    while frontier:
        here, mask, depth = frontier.popleft()
        if max_depth is not None and depth >= max_depth:
            continue
        key = mask << shift | here
        for direction, offset in enumerate(offsets):
            step_to = here + offset
            if not open_cell[step_to]:
                continue
            new_mask = mask
            if (mask >> step_to) & 1:
                beyond = step_to + offset
                if not open_cell[beyond] or (mask >> beyond) & 1:
                    continue  # a box against a wall or another box does not move
                new_mask = mask ^ (1 << step_to) ^ (1 << beyond)
            new_key = new_mask << shift | step_to
            if new_key in parents:
                continue
            parents[new_key] = (key, direction)
            if new_mask == targets:
                return _walk_back(parents, new_key)
            if len(parents) > max_states:
                return None
            frontier.append((step_to, new_mask, depth + 1))
    return None


def _walk_back(parents: dict, key: int) -> tuple[int, ...]:
    moves = []
    while True:
        parent, direction = parents[key]
        if parent < 0:
            return tuple(reversed(moves))
        moves.append(direction)
        key = parent
