"""RAGEN-2's Sokoban room generator, written again here: same algorithm, same random draws.

RAGEN-2 (ragen/env/sokoban/utils.py, adapted from gym-sokoban) seeds Python's `random` and
numpy's legacy global RNG with the env seed, then:

1. carves floor with a random walk of int(1.7 * (rows + cols)) steps, stamping one of five
   small shapes at each position (the same shapes as `sokoban_generator.FLOOR_SHAPES`);
2. places the player, then each box on a target, at uniformly drawn floor cells (numpy);
3. plays backwards by depth-first search: only "pull" moves (the player steps, dragging a
   box that was behind it), depth-limited by `search_depth` (a state d moves deep is scored
   and expanded only while d <= search_depth - 2), each room state visited once in the whole
   search (the first path to reach it wins), at most 300,000 states. The first state with the highest
   box_swaps * total box displacement, whose targets are all uncovered, is the room;
4. repeats 1-3 up to 4 times while the best score is 0 (then the draw fails);
5. moves the player 1-3 random steps onto free cells not visited before (probability 0.8
   when the box moved only one cell, else 0.5; after each step it goes on with 0.5).

Step 5 makes the player start away from the box, so rooms are not always solvable in the
reverse path's length, and the shortest solution is not known: `generate_ragen_room`
computes it by BFS (`envs.sokoban_solver`).

The state hash in step 3 is RAGEN's: a box that was pulled is a different cell value from
one that never moved, so "box back on its target after a pull" and "box never pulled" are
distinct states; this changes which states the search visits and is kept.

Using `random.Random(seed)` and `np.random.RandomState(seed)` instances (never the global
generators) gives the same draws as RAGEN's `all_seed(seed)`, so seed s is RAGEN-2's room s
(tests/envs/test_sokoban.py pins rooms derived from RAGEN-2's code). One departure: when a draw
fails, RAGEN retries with `abs(hash(str(seed))) % 2**32`, which differs between processes
(string hashing is salted); we retry with a seed drawn from `np.random.default_rng([seed,
retry])`, the same everywhere.
"""

from __future__ import annotations

import random

import numpy as np

from envs.sokoban_generator import FLOOR, FLOOR_SHAPES, TARGET, WALL, GeneratedRoom, RoomGenerationError, \
    num_walk_steps
from envs.sokoban_solver import shortest_solution

# gym-sokoban's walk directions, in its order (the draws index into this list).
WALK_DIRECTIONS = [(1, 0), (0, 1), (-1, 0), (0, -1)]
SHAPES = list(FLOOR_SHAPES)
P_CHANGE_DIRECTION = 0.35
TRIES = 4                 # generate_room's tries per seed
MAX_EXPLORED = 300_000    # depth_first_search's state cap
MAX_SEED_RETRIES = 100    # fresh seeds after failed draws (RAGEN-2 retries without limit)
# Cell values during reverse play (gym-sokoban's generation codes).
PULLED_BOX, RESTING_BOX, PLAYER = 3, 4, 5


class _DrawFailed(Exception):
    """This seed gives no room (too little floor, or no pull moves a box): try another."""


def _carve(py: random.Random, dim_x: int, dim_y: int, steps: int) -> bytearray:
    grid = bytearray(dim_x * dim_y)
    direction = py.sample(WALK_DIRECTIONS, 1)[0]
    row, col = py.randint(1, dim_x - 1), py.randint(1, dim_y - 1)
    for _ in range(steps):
        if py.random() < P_CHANGE_DIRECTION:
            direction = py.sample(WALK_DIRECTIONS, 1)[0]
        row = max(min(row + direction[0], dim_x - 2), 1)
        col = max(min(col + direction[1], dim_y - 2), 1)
        for d_row, d_col in py.sample(SHAPES, 1)[0]:
            grid[(row + d_row) * dim_y + col + d_col] = FLOOR
    for col in range(dim_y):
        grid[col] = grid[(dim_x - 1) * dim_y + col] = WALL
    for row in range(dim_x):
        grid[row * dim_y] = grid[row * dim_y + dim_y - 1] = WALL
    return grid


def _place(rs: np.random.RandomState, floor: bytearray, num_boxes: int) -> tuple[int, list[int]]:
    """(player, targets): numpy draws over the free floor cells in row-major order."""
    free = [cell for cell, kind in enumerate(floor) if kind == FLOOR]
    if len(free) <= num_boxes + 1:
        raise _DrawFailed("not enough floor for the player and the boxes")
    player = free[rs.randint(len(free))]
    targets = []
    for _ in range(num_boxes):
        free = [cell for cell in free if cell != player and cell not in targets]
        targets.append(free[rs.randint(len(free))])
    return player, sorted(targets)  # sorted: RAGEN's box mapping lists targets row-major


def _reverse_play(structure: bytearray, dim_y: int, player: int, targets: list[int], search_depth: int):
    """Depth-first pull search: (score, state, box positions) of the first best-scoring state,
    or score 0 with no state when the search never got past the start."""
    state = bytearray(structure)
    for cell in targets:
        state[cell] = RESTING_BOX
    state[player] = PLAYER
    offsets = (-dim_y, dim_y, -1, 1)
    num_boxes = len(targets)
    explored: set[bytes] = set()
    best = [-1, None, tuple(targets)]  # score, state, box positions

    def enter(state, player, boxes, swaps, last_pull, ttl):
        """A DFS call's prologue: None when it returns at once, else the frame to expand."""
        ttl -= 1
        if ttl <= 0 or len(explored) >= MAX_EXPLORED:
            return None
        key = bytes(state)
        if key in explored:
            return None
        uncovered = sum(state[cell] == TARGET for cell in targets)
        score = 0
        if uncovered == num_boxes:
            displacement = sum(abs(b // dim_y - t // dim_y) + abs(b % dim_y - t % dim_y)
                               for b, t in zip(boxes, targets))
            score = swaps * displacement
        if score > best[0]:
            best[:] = [score, bytearray(state), tuple(boxes)]
        explored.add(key)
        return [state, player, boxes, swaps, last_pull, ttl, 0]

    root = enter(state, player, list(targets), 0, -1, search_depth)
    stack = [root] if root is not None else []
    while stack:
        frame = stack[-1]
        state, player, boxes, swaps, last_pull, ttl, action = frame
        if action == 4:
            stack.pop()
            continue
        frame[6] = action + 1
        offset = offsets[action]
        step_to = player + offset
        child, child_boxes, child_last, child_player = bytearray(state), list(boxes), last_pull, player
        if child[step_to] in (FLOOR, TARGET):
            child[player] = structure[player]
            child[step_to] = PLAYER
            behind = player - offset
            if child[behind] in (PULLED_BOX, RESTING_BOX):
                child[player] = PULLED_BOX
                child[behind] = structure[behind]
                index = child_boxes.index(behind)
                child_boxes[index] = player
                child_last = index
            child_player = step_to
        new_frame = enter(child, child_player, child_boxes, swaps + (child_last != last_pull), child_last, ttl)
        if new_frame is not None:
            stack.append(new_frame)
    return max(best[0], 0), best[1], best[2]


def _displacement(boxes, targets, dim_y: int) -> int:
    return sum(abs(b // dim_y - t // dim_y) + abs(b % dim_y - t % dim_y) for b, t in zip(boxes, targets))


def _random_player_moves(py: random.Random, state: bytearray, structure: bytearray, dim_y: int,
                         move_probability: float, continue_probability: float = 0.5, max_steps: int = 3) -> None:
    if py.random() > move_probability:
        return
    player = state.index(PLAYER)
    visited = [player]
    steps = 0
    while steps < max_steps:
        moves = [player + off for off in (-dim_y, dim_y, -1, 1)
                 if state[player + off] in (FLOOR, TARGET) and player + off not in visited]
        if not moves:
            break
        step_to = py.choice(moves)
        state[player] = structure[player]
        state[step_to] = PLAYER
        player = step_to
        visited.append(player)
        steps += 1
        if steps >= max_steps or py.random() > continue_probability:
            break


def _draw(seed: int, dim_x: int, dim_y: int, num_boxes: int, search_depth: int):
    py = random.Random(seed)
    # np.random.seed(seed) accepts 0 <= seed < 2**32; larger seeds are split into 32-bit words.
    rs = np.random.RandomState(seed if seed < 2**32 else [seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF,
                                                         seed >> 64])
    steps = num_walk_steps(dim_x, dim_y)
    for _ in range(TRIES):
        structure = _carve(py, dim_x, dim_y, steps)
        player, targets = _place(rs, structure, num_boxes)
        for cell in targets:
            structure[cell] = TARGET
        score, state, boxes = _reverse_play(structure, dim_y, player, targets, search_depth)
        displacement = _displacement(boxes, targets, dim_y)
        if displacement > 0:
            break
    else:
        raise _DrawFailed("no pull moved a box off its target")
    _random_player_moves(py, state, structure, dim_y, 0.8 if displacement == 1 else 0.5)
    return structure, tuple(sorted(boxes)), state.index(PLAYER), score


def generate_ragen_room(seed: int, dim_x: int = 6, dim_y: int = 6, num_boxes: int = 1,
                        search_depth: int = 300) -> GeneratedRoom:
    """RAGEN-2's room for `seed` (a non-negative int), with a BFS shortest solution."""
    current = int(seed)
    for attempt in range(1, MAX_SEED_RETRIES + 1):
        try:
            structure, boxes, player, score = _draw(current, dim_x, dim_y, num_boxes, search_depth)
        except _DrawFailed:
            current = int(np.random.default_rng([int(seed), attempt]).integers(2**32))
            continue
        solution = shortest_solution(structure, dim_y, boxes, player) or ()
        return GeneratedRoom(dim_x, dim_y, tuple(structure), boxes, player, solution, score, attempt)
    raise RoomGenerationError(
        f"no {dim_x}x{dim_y} room with {num_boxes} box(es) at search_depth={search_depth} after "
        f"{MAX_SEED_RETRIES} seeds; use a larger room, fewer boxes or a deeper search")

