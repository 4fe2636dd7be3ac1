"""Sokoban room generation by reverse play (the gym-sokoban recipe, searched breadth-first).

1. Carve floor: a random walk inside the room stamps small floor shapes (a bar, a corner,
   a square) around each position it visits; the border stays wall. The floor is
   connected because every shape contains the walk's current cell.
2. Place `num_boxes` targets on distinct floor cells, each box on its target.
3. Play backwards: the player walks, or walks away from an adjacent box and drags it
   along (a pull, the inverse of a push). A breadth-first search over (player, boxes)
   states, at most `search_depth` reverse steps deep, scores every state where no box
   sits on a target by `box_switches * total box displacement` (gym-sokoban's score:
   boxes far from their targets, and solutions that alternate between boxes) and picks
   one of the best-scoring states at random; its player cell is the start position.

Unlike gym-sokoban, the search starts from every solved state at once (the player may end
anywhere), so a state's depth is the length of its shortest solution: every room is
solvable, `GeneratedRoom.solution` is an optimal solution, and it has at most
`search_depth` actions. Rooms with no state scoring above zero are redrawn from the same
random stream.

Speed: the search runs on plain ints (flat cell indices, a bitmask of box cells), with a
neighbour step of ±1 / ±width and no bounds checks (the border is wall); the walk and
choices use a `random.Random` seeded once from the caller's numpy Generator, because a
numpy call per coin flip costs more than the whole walk.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

WALL, FLOOR, TARGET = 0, 1, 2
# Direction order is the action order everywhere: Up, Down, Left, Right (row, col steps).
DIRECTION_STEPS = ((-1, 0), (1, 0), (0, -1), (0, 1))
# Floor shapes stamped around the walk's position, as (row, col) offsets from it.
FLOOR_SHAPES = (
    ((0, -1), (0, 0), (0, 1)),            # horizontal bar
    ((-1, 0), (0, 0), (1, 0)),            # vertical bar
    ((0, -1), (0, 0), (1, 0)),            # corner: left and down
    ((0, -1), (0, 0), (1, -1), (1, 0)),   # 2x2 square, down-left
    ((0, 0), (0, 1), (1, 0)),             # corner: right and down
)
P_CHANGE_DIRECTION = 0.35
MAX_ATTEMPTS = 200          # redraws before giving up on a config that cannot produce rooms
MAX_SEARCH_STATES = 50_000  # bounds time (~0.3 s) and memory of a deep search in a large room


class RoomGenerationError(RuntimeError):
    """No usable room came out of MAX_ATTEMPTS draws (the config is too tight)."""


@dataclass(frozen=True)
class GeneratedRoom:
    """A start state. Cells are flat row-major indices: cell = row * dim_y + col."""

    dim_x: int                 # rows
    dim_y: int                 # columns
    fixed: tuple[int, ...]     # WALL / FLOOR / TARGET per cell (boxes and player excluded)
    boxes: tuple[int, ...]     # box cells, sorted
    player: int
    solution: tuple[int, ...]  # a shortest solution: direction indices into DIRECTION_STEPS
    score: int                 # the reverse-play score of the chosen state (> 0)
    attempts: int              # draws needed (1 = the first room was usable)


def num_walk_steps(dim_x: int, dim_y: int) -> int:
    """gym-sokoban's walk length for a room size."""
    return int(1.7 * (dim_x + dim_y))


def _below(draw, n: int) -> int:
    """A uniform int in [0, n) from `random()`, the one method whose stream Python keeps
    fixed across versions (randrange/sample may change), so rooms stay the same."""
    return min(int(draw() * n), n - 1)


def carve_floor(draw, dim_x: int, dim_y: int, steps: int) -> bytearray:
    """Random-walk floor carving; returns a flat WALL/FLOOR grid with a wall border."""
    grid = bytearray(dim_x * dim_y)
    row_step, col_step = DIRECTION_STEPS[_below(draw, 4)]
    row = 1 + _below(draw, dim_x - 2)
    col = 1 + _below(draw, dim_y - 2)
    for _ in range(steps):
        if draw() < P_CHANGE_DIRECTION:
            row_step, col_step = DIRECTION_STEPS[_below(draw, 4)]
        # Clamp to the interior so every stamp stays inside the array.
        row = min(max(row + row_step, 1), dim_x - 2)
        col = min(max(col + col_step, 1), dim_y - 2)
        for d_row, d_col in FLOOR_SHAPES[_below(draw, len(FLOOR_SHAPES))]:
            grid[(row + d_row) * dim_y + col + d_col] = FLOOR
    for col in range(dim_y):
        grid[col] = grid[(dim_x - 1) * dim_y + col] = WALL
    for row in range(dim_x):
        grid[row * dim_y] = grid[row * dim_y + dim_y - 1] = WALL
    return grid


def reverse_search(floor: bytearray, dim_y: int, targets: tuple[int, ...], search_depth: int,
                   draw) -> tuple[int, int, tuple[int, ...], tuple[int, ...]]:
    """Breadth-first reverse play from every solved state (boxes on targets, player on any
    free floor cell: a forward episode ends wherever the player stands after the last push).

    Because the search starts from all solved states at once, a state's depth is the length
    of its shortest forward solution. Returns (score, player, boxes, forward_solution) for a
    best state chosen with `draw`, or score 0 when no state within `search_depth` steps has
    every box off its target. States are deduplicated by (player, set of box cells); box
    identities (which target a box came from, for the displacement) and the switch count
    follow the first path found, as in gym-sokoban's search.
    """
    num_cells = len(floor)
    rows = [cell // dim_y for cell in range(num_cells)]
    cols = [cell % dim_y for cell in range(num_cells)]
    # Per floor cell: (direction, cell one step that way, cell one step the other way),
    # only for steps onto floor. No bounds checks: floor cells are interior.
    offsets = (-dim_y, dim_y, -1, 1)
    neighbours = [
        tuple((d, cell + off, cell - off) for d, off in enumerate(offsets) if floor[cell + off]) if floor[cell] else ()
        for cell in range(num_cells)
    ]
    target_mask = 0
    for cell in targets:
        target_mask |= 1 << cell
    shift = num_cells.bit_length()  # state key = box mask << shift | player cell

    def score_of(boxes: tuple[int, ...], switches: int) -> int:
        """Switches times total displacement; 0 while a box sits on a target."""
        displacement = 0
        for box, target in zip(boxes, targets):
            if (target_mask >> box) & 1:
                return 0
            displacement += abs(rows[box] - rows[target]) + abs(cols[box] - cols[target])
        return switches * displacement

    # One tuple per state: (player, box mask, boxes by origin target, last pulled box index,
    # box switches, score). Parent and move are kept apart, only for the solution.
    states = [(cell, target_mask, targets, -1, 0, 0) for cell in range(num_cells)
              if floor[cell] and not (target_mask >> cell) & 1]
    parents = [-1] * len(states)
    moves = [-1] * len(states)  # reverse direction index taken to reach the state
    seen = {target_mask << shift | state[0] for state in states}
    best_score, best_states = 0, []

    frontier = list(range(len(states)))
    for depth in range(1, search_depth + 1):
        # States on the last level are never expanded: keep only those that could be chosen.
        last_level = depth == search_depth
        next_frontier = []
        for state in frontier:
            here, mask, boxes, last, switches, score = states[state]
            walk_useful = not last_level or (score and score >= best_score)
            for direction, step_to, behind in neighbours[here]:
                if (mask >> step_to) & 1:
                    continue
                # A plain walk: boxes stay, so the score is the parent's.
                key = mask << shift | step_to
                if walk_useful and key not in seen:
                    seen.add(key)
                    index = len(states)
                    states.append((step_to, mask, boxes, last, switches, score))
                    parents.append(state); moves.append(direction); next_frontier.append(index)
                    if score and score >= best_score:
                        if score > best_score:
                            best_score, best_states = score, []
                        best_states.append(index)
                # A pull: the box behind the player follows it into `here`.
                if (mask >> behind) & 1:
                    new_mask = mask ^ (1 << behind) ^ (1 << here)
                    key = new_mask << shift | step_to
                    if key in seen:
                        continue
                    pulled = boxes.index(behind)
                    new_boxes = boxes[:pulled] + (here,) + boxes[pulled + 1:]
                    new_switches = switches + (pulled != last)
                    new_score = score_of(new_boxes, new_switches)
                    if last_level and new_score < best_score:
                        continue
                    seen.add(key)
                    index = len(states)
                    states.append((step_to, new_mask, new_boxes, pulled, new_switches, new_score))
                    parents.append(state); moves.append(direction); next_frontier.append(index)
                    if new_score and new_score >= best_score:
                        if new_score > best_score:
                            best_score, best_states = new_score, []
                        best_states.append(index)
        frontier = next_frontier
        if not frontier or len(states) >= MAX_SEARCH_STATES:
            break

    if best_score == 0:
        return 0, -1, targets, ()
    chosen = best_states[_below(draw, len(best_states))]
    # Walking the reverse path backwards gives the forward solution; a reverse step in
    # direction d is undone by a forward step in the opposite direction (d ^ 1).
    solution = []
    state = chosen
    while parents[state] >= 0:
        solution.append(moves[state] ^ 1)
        state = parents[state]
    return best_score, states[chosen][0], tuple(sorted(states[chosen][2])), tuple(solution)


def generate_room(rng: np.random.Generator, dim_x: int = 6, dim_y: int = 6, num_boxes: int = 1,
                  search_depth: int = 300) -> GeneratedRoom:
    """Draw a solvable room from `rng` (the only source of randomness)."""
    if dim_x < 5 or dim_y < 5:
        raise ValueError(f"a room needs at least 5x5 cells (a 3x3 interior), got {dim_x}x{dim_y}")
    if num_boxes < 1 or search_depth < 1:
        raise ValueError(f"num_boxes and search_depth must be >= 1, got {num_boxes}, {search_depth}")
    draw = random.Random(int(rng.integers(0, 2**63))).random
    steps = num_walk_steps(dim_x, dim_y)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        floor = carve_floor(draw, dim_x, dim_y, steps)
        floor_cells = [cell for cell, kind in enumerate(floor) if kind]
        if len(floor_cells) < num_boxes + 2:  # too cramped for a player, the boxes and a pull
            continue
        targets = []
        for _ in range(num_boxes):
            targets.append(floor_cells.pop(_below(draw, len(floor_cells))))
        score, start_player, boxes, solution = reverse_search(floor, dim_y, tuple(targets), search_depth, draw)
        if score == 0:
            continue
        fixed = list(floor)
        for cell in targets:
            fixed[cell] = TARGET
        return GeneratedRoom(dim_x, dim_y, tuple(fixed), boxes, start_player, solution, score, attempt)
    raise RoomGenerationError(
        f"no solvable {dim_x}x{dim_y} room with {num_boxes} box(es) within search_depth={search_depth} "
        f"after {MAX_ATTEMPTS} draws; use a larger room, fewer boxes or a deeper search"
    )
