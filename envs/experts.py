"""Expert policies: the turn a solver would play from an env's current state.

    turn = expert_turn(env)                      # after env.reset(...) or any number of steps
    env.step(f"<think>{turn.grounded}</think><answer>{' || '.join(turn.actions)}</answer>")

The contract:
- `expert_turn(env)` is recomputed from the env's state on every call, so it acts from any
  state, including one a policy reached. It raises `NoExpertError` (a ValueError) for an env
  without an expert and `EpisodeOverError` once the episode is over.
- `ExpertTurn.actions` are canonical actions (the env's `action_vocabulary` spelling), or one
  answer string for a free-form env; never more than `config.max_actions_per_turn` nor more
  than `env.actions_left`.
- `ExpertTurn.grounded` is 1-3 short plain sentences (under about 40 words) of reasoning
  stating facts read off the current observation that the actions depend on (positions, the
  plan); inputs needing different actions get different text. `template` is TEMPLATE_REASONING,
  one text for every input of every env (the "template collapse" control for demos).
- `turns_left` (optional, keyword): the turns the caller's rollout still allows. Only
  FrozenLake's planner uses it (and its grounded text); None means "as many turns as
  actions left", i.e. no turn limit beyond the env's own action budget.

Guarantees, per env:
- Sokoban (every variant): a shortest solution from the current state within the remaining
  action budget (`shortest_solution` BFS); its first min(max_actions_per_turn, actions_left)
  moves. Where none fits the budget it plays the unbounded shortest solution, else any move.
- FrozenLake: maximises the probability of reaching the goal within the remaining budget under
  the env's own transition table (`transition_table(map, success_rate)`), exactly (finite-
  horizon dynamic programming); ties go to fewer expected moves, then to the action order.
  Deterministic ice (every move has one outcome): a shortest hole-free path, up to
  max_actions_per_turn moves a turn. Slippery ice: one move a turn (a closed-loop policy is at
  least as good as any open-loop sequence); with `turns_left` below the actions left, open-loop
  sequences of up to max_actions_per_turn moves a turn are planned exactly over the turns.
- Countdown: an exhaustive search over every expression of the given numbers (each once,
  + - * /, exact fractions) that the env's own `score_answer` scores correct, when one exists.
- Bandit: the arm with the higher expected payoff (`best_arm`).
- MetaMathQA: the dataset's answer (the label after "The answer is: ").
- SearchQA: searches the supporting paragraphs' titles in order (skipping one already shown),
  then `finish[gold answer]` once the last is shown, or at once on its last action.
- DeepCoder: the problem's reference solution, where the data has one (NoExpertError if not).
WebShop has none.
An env of your own: override `TextEnv.expert_turn(self, turns_left=None) -> ExpertTurn` on its class
(docs/custom_env.md, "Warm-start it"); `expert_turn(env)` and `has_expert` use it before the table.
"""

from __future__ import annotations

import functools
import itertools
from collections import deque
from dataclasses import dataclass
from fractions import Fraction

from envs.base import EpisodeOverError, TextEnv

TEMPLATE_REASONING = "Let me think about the best move and then answer."
GAMMA = 0.99  # discount for the tie-break "fewer expected moves" only; success probability ranks first
TOLERANCE = 1e-9  # probabilities within this are ties (float sums of the same terms in another order)


class NoExpertError(ValueError):
    """The env has no expert policy."""


@dataclass(frozen=True)
class ExpertTurn:
    actions: tuple[str, ...]
    grounded: str
    template: str = TEMPLATE_REASONING


def _cell(position: tuple[int, int]) -> str:
    return f"({position[0]}, {position[1]})"


def _cells(positions) -> str:
    return ", ".join(_cell(p) for p in positions) or "none"


def _moves(n: int) -> str:
    return f"{n} move" if n == 1 else f"{n} moves"


def _listed(moves: list[str], shown: int = 2) -> str:
    """The first `shown` moves of a plan (the rest as "…"): a plan can be longer than a turn's tokens."""
    return ", ".join(moves[:shown]) + (", …" if len(moves) > shown else "")


def _budget(env: TextEnv) -> int:
    return min(env.config.max_actions_per_turn, env.actions_left)


# --- Sokoban ------------------------------------------------------------------------------

def _sokoban_turn(env, turns_left: int | None) -> ExpertTurn:
    from envs.sokoban import ACTIONS
    from envs.sokoban_generator import TARGET, WALL
    from envs.sokoban_solver import shortest_solution

    dim_y, left = env.dim_y, env.actions_left
    where = lambda cell: divmod(cell, dim_y)  # noqa: E731
    loose = sorted(where(b) for b in env.boxes if env.fixed[b] != TARGET)
    free = sorted(where(c) for c, kind in enumerate(env.fixed) if kind == TARGET and c not in env.boxes)
    # Short on purpose: the reasoning and the answer must fit a CPU rollout's turn (48 tokens of the
    # bundled model in the presets), or a policy could never sample the demo it was trained on.
    facts = f"At {_cell(where(env.player))}. "
    facts += (f"Box {_cell(loose[0])} to {_cell(free[0])}. " if len(loose) == 1
              else f"Boxes {_cells(loose)} to {_cells(free)}. ")
    plan = shortest_solution(env.fixed, dim_y, env.boxes, env.player, max_depth=left)
    if plan is not None:
        moves = [ACTIONS[d] for d in plan]
        text = f"Plan: {_listed(moves)}."
    else:
        plan = shortest_solution(env.fixed, dim_y, env.boxes, env.player)
        if plan is not None:
            text = f"Needs {_moves(len(plan))}, more than the {left} I have."
        else:  # a box is stuck: no move helps, so take any move that changes the room
            plan = next(((d,) for d, step in enumerate((-dim_y, dim_y, -1, 1))
                         if env.fixed[env.player + step] != WALL and (env.player + step not in env.boxes or (
                             env.fixed[env.player + 2 * step] != WALL and env.player + 2 * step not in env.boxes))),
                        (0,))
            text = "No sequence of moves can place every box any more."
    return ExpertTurn(tuple(ACTIONS[d] for d in plan[:_budget(env)]), facts + text)


# --- FrozenLake ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=256)
def _lake_model(rows: tuple[str, ...], success_rate: float) -> tuple:
    """Per state and action, the outcomes with positive probability: (prob, next, goal, terminal)."""
    from envs.frozen_lake import transition_table

    table = transition_table(rows, success_rate)
    goal = "".join(rows).index("G")
    return tuple(tuple(tuple((p, s2, s2 == goal, bool(done)) for p, s2, _, done in table[s][a] if p > 0)
                       for a in range(4)) for s in range(len(table)))


def _pick(candidates, prefer_short: bool):
    """The (P, W, actions) with the highest P, then W, then length preference, then first listed."""
    best_p = max(c[0] for c in candidates)
    near = [c for c in candidates if c[0] >= best_p - TOLERANCE]
    best_w = max(c[1] for c in near)
    near = [c for c in near if c[1] >= best_w - TOLERANCE]
    length = (min if prefer_short else max)(len(c[2]) for c in near)
    return next(c for c in near if len(c[2]) == length)


@functools.lru_cache(maxsize=64)
def _closed_loop(rows: tuple[str, ...], success_rate: float, horizon: int) -> tuple:
    """V[n][s] = (P(goal within n moves), E[GAMMA**moves; goal], best action) acting one move
    at a time, by backward induction from n = 0 (standard finite-horizon value iteration)."""
    model = _lake_model(rows, success_rate)
    values = [tuple((0.0, 0.0, None) for _ in model)]
    for _ in range(horizon):
        prev = values[-1]
        row = []
        for outcomes in model:
            candidates = []
            for a, moves in enumerate(outcomes):
                p = sum(q * (1.0 if g else 0.0 if d else prev[s2][0]) for q, s2, g, d in moves)
                w = sum(q * GAMMA * (1.0 if g else 0.0 if d else prev[s2][1]) for q, s2, g, d in moves)
                candidates.append((p, w, (a,)))
            row.append(_pick(candidates, prefer_short=True))
        values.append(tuple(row))
    return tuple(values)


class _TurnPlanner:
    """Exact planning over turns: each turn plays an open-loop sequence of 1..m moves (the env
    stops a sequence at a terminal tile). Used only while turns are scarcer than moves; once
    turns >= moves the closed-loop one-move-a-turn values are optimal and taken from there."""

    def __init__(self, rows: tuple[str, ...], success_rate: float, per_turn: int, horizon: int):
        self.model = _lake_model(rows, success_rate)
        self.closed = _closed_loop(rows, success_rate, horizon)
        self.per_turn, self.memo = per_turn, {}

    def value(self, state: int, turns: int, moves: int) -> tuple:
        if moves <= 0 or turns <= 0:
            return (0.0, 0.0, ())
        if turns >= moves:
            p, w, action = self.closed[moves][state]
            return (p, w, action)
        key = (state, turns, moves)
        if key not in self.memo:
            candidates = []
            self._expand({state: 1.0}, (), 0.0, 0.0, turns, moves, candidates)
            self.memo[key] = _pick(candidates, prefer_short=True)
        return self.memo[key]

    def _expand(self, live: dict, prefix: tuple, p_goal: float, w_goal: float, turns: int, moves: int, out: list):
        for a in range(4):
            seq, nxt, p, w = prefix + (a,), {}, p_goal, w_goal
            for s, mass in live.items():
                for q, s2, g, d in self.model[s][a]:
                    if g:
                        p, w = p + mass * q, w + mass * q * GAMMA ** len(seq)
                    elif not d:
                        nxt[s2] = nxt.get(s2, 0.0) + mass * q
            later = [(mass, self.value(s2, turns - 1, moves - len(seq))) for s2, mass in nxt.items()]
            out.append((p + sum(m * v[0] for m, v in later),
                        w + sum(m * GAMMA ** len(seq) * v[1] for m, v in later), seq))
            if len(seq) < min(self.per_turn, moves) and nxt:
                self._expand(nxt, seq, p, w, turns, moves, out)


@functools.lru_cache(maxsize=64)
def _turn_planner(rows, success_rate, per_turn, horizon) -> _TurnPlanner:
    return _TurnPlanner(rows, success_rate, per_turn, horizon)


def _lake_deterministic(model) -> bool:
    return all(len(moves) == 1 for outcomes in model for moves in outcomes)


def _lake_plan(env, turns_left: int | None) -> tuple[float, tuple[int, ...], tuple[int, ...] | None]:
    """(success probability, this turn's action indices, whole path if deterministic)."""
    rows, rate = env.map, float(env.config.success_rate)
    model, moves, per_turn = _lake_model(rows, rate), env.actions_left, env.config.max_actions_per_turn
    turns = moves if turns_left is None else min(turns_left, moves)
    if _lake_deterministic(model):
        path = _lake_shortest_path(model, env.state)
        if path is None:
            return 0.0, _closed_loop(rows, rate, 1)[1][env.state][2], None
        fits = len(path) <= min(moves, turns * per_turn)
        return float(fits), path[:min(per_turn, moves)], path
    p, _, actions = _turn_planner(rows, rate, per_turn, env.config.max_actions_per_traj).value(env.state, turns, moves)
    return p, actions, None


def _lake_shortest_path(model, start: int) -> tuple[int, ...] | None:
    """BFS over hole-free moves, actions tried in order, so the path is the first shortest one."""
    parents, frontier = {start: None}, deque([start])
    while frontier:
        s = frontier.popleft()
        for a, ((_, s2, g, d),) in enumerate(model[s]):
            if s2 in parents or (d and not g):
                continue
            parents[s2] = (s, a)
            if g:
                path = []
                while parents[s2] is not None:
                    s2, a2 = parents[s2]
                    path.append(a2)
                return tuple(reversed(path))
            frontier.append(s2)
    return None


def lake_success_probability(env, *, turns_left: int | None = None) -> float:
    """The expert's (the optimal) probability of reaching the goal from env's current state."""
    return _lake_plan(env, turns_left)[0]


def _lake_turn(env, turns_left: int | None) -> ExpertTurn:
    from envs.frozen_lake import ACTIONS

    p, actions, path = _lake_plan(env, turns_left)
    cols = len(env.map[0])
    goal = divmod("".join(env.map).index("G"), cols)
    (r, c), names = env.player_position, [ACTIONS[a] for a in actions]
    holes = [(r + dr, c + dc) for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1))
             if 0 <= r + dr < len(env.map) and 0 <= c + dc < cols and env.map[r + dr][c + dc] == "H"]
    # Short on purpose (see _sokoban_turn): positions read off the grid, then the plan.
    text = f"At {_cell((r, c))}, goal {_cell(goal)}. "
    if holes:
        text += f"Holes {_cells(holes)}. "
    if path is not None and p > 0:
        text += f"Path: {_listed([ACTIONS[a] for a in path])}."
    elif p > 0:
        text += f"Safest: {', '.join(names)}."
    else:
        text += f"The goal cannot be reached within {_moves(env.actions_left)}; I try {', '.join(names)}."
    return ExpertTurn(tuple(names), text)


# --- single-answer envs -------------------------------------------------------------------

def countdown_solution(numbers, target) -> str | None:
    """An expression using each number once that equals `target` exactly, or None when no
    expression over + - * / and parentheses does. Exhaustive: every pair of the remaining
    values is combined every way, and a multiset of values already explored is not re-explored
    (what can be built from it does not depend on how it was reached)."""
    goal, seen = Fraction(target), set()

    def search(pool):
        if len(pool) == 1:
            return pool[0][1] if pool[0][0] == goal else None
        key = tuple(sorted(value for value, _ in pool))
        if key in seen:
            return None
        seen.add(key)
        for i, j in itertools.combinations(range(len(pool)), 2):
            (a, a_text), (b, b_text) = pool[i], pool[j]
            rest = [item for k, item in enumerate(pool) if k not in (i, j)]
            options = [(a + b, f"({a_text} + {b_text})"), (a * b, f"({a_text} * {b_text})"),
                       (a - b, f"({a_text} - {b_text})"), (b - a, f"({b_text} - {a_text})")]
            options += [(a / b, f"({a_text} / {b_text})")] if b else []
            options += [(b / a, f"({b_text} / {a_text})")] if a else []
            for value, text in options:
                found = search(rest + [(value, text)])
                if found is not None:
                    return found
        return None

    found = search([(Fraction(int(n)), str(int(n))) for n in numbers])
    return None if found is None else (found[1:-1] if found.startswith("(") and len(numbers) > 1 else found)


def _countdown_turn(env, turns_left: int | None) -> ExpertTurn:
    from envs.countdown import score_answer

    nums = ", ".join(str(n) for n in env.numbers)
    expression = countdown_solution(env.numbers, env.target)
    if expression is None or not score_answer(expression, env.numbers, env.target).correct:
        expression = " + ".join(str(n) for n in env.numbers)  # no exact answer: a well-formed one
        return ExpertTurn((expression,), f"No expression of {nums} equals {env.target}; I use every number once.")
    return ExpertTurn((expression,), f"The target is {env.target} and the numbers are {nums}. "
                                     f"{expression} = {env.target}, using each number once.")


def _bandit_turn(env, turns_left: int | None) -> ExpertTurn:
    config, best = env.config, env.best_arm
    other = next(arm for arm in env.shown_order if arm != best)
    mean = {env.high_risk_arm: config.high_risk_expected_payoff, env.low_risk_arm: config.low_risk_payoff}
    return ExpertTurn((best,), f"The arms are {env.shown_order[0]} and {env.shown_order[1]}. {best} pays "
                               f"{mean[best]:g} on average, more than {other}'s {mean[other]:g}, so I pull {best}.")


def _question(text: str, words: int = 20) -> str:
    """The last sentence of a problem (where the question usually is), at most `words` words."""
    sentences = [part.strip() for part in text.replace("\n", " ").replace("?", "?|").replace(". ", ".|").split("|")]
    asked = next((part for part in reversed(sentences) if part), text.strip()).split()
    return " ".join(asked[:words]) + (" ..." if len(asked) > words else "")


def _math_turn(env, turns_left: int | None) -> ExpertTurn:
    label = env.problem.label
    return ExpertTurn((label,), f'The problem asks: "{_question(env.problem.query)}" The answer is {label}.')


def _searchqa_turn(env, turns_left: int | None) -> ExpertTurn:
    """Search each supporting paragraph by its title, in order, then finish with the gold answer.
    Only what the observation shows is used (this turn's results), so it acts from any state;
    with one action left it finishes, so every episode ends with the gold answer."""
    question, titles = env.question, env.question.supporting_titles
    shown = {p.title for _, passages in env.results for p in passages}
    reached = max((i for i, title in enumerate(titles) if title in shown), default=-1)
    if reached == len(titles) - 1 or env.actions_left <= 1:
        where = ("This is my last action" if reached < len(titles) - 1 else "No paragraph is needed" if not titles
                 else f'The paragraph on "{titles[reached]}" is shown')
        return ExpertTurn((f"finish[{question.answer}]",), f"{where}: the answer is {question.answer}.")
    title = titles[reached + 1]
    text = (f'I have the paragraph on "{titles[reached]}"; next I need the one on "{title}"' if reached >= 0
            else f'To answer "{_question(question.question, 14)}" I need the paragraph on "{title}"')
    return ExpertTurn((f"search[{title}]",), f"{text}, so I search for it.")


def _deepcoder_turn(env, turns_left: int | None) -> ExpertTurn:
    solution = env.problem.solution.strip()
    if not solution:
        raise NoExpertError(f"DeepCoder problem {env.problem.problem_id!r} has no reference solution to play")
    return ExpertTurn((f"```python\n{solution}\n```",),
                      f'The task: "{_question(env.problem.statement, 16)}" I write a program that does exactly that.')


# --- dispatch -----------------------------------------------------------------------------

# (module, class name, expert): looked up by class so every registered variant of a class
# (LargerSokoban, CoordFrozenLake, BanditRev, ...) shares its expert.
_EXPERTS = (
    ("envs.sokoban", "SokobanEnv", _sokoban_turn),
    ("envs.frozen_lake", "FrozenLakeEnv", _lake_turn),
    ("envs.countdown", "CountdownEnv", _countdown_turn),
    ("envs.bandit", "BanditEnv", _bandit_turn),
    ("envs.metamathqa", "MetaMathQAEnv", _math_turn),
    ("envs.searchqa", "SearchQAEnv", _searchqa_turn),
    ("envs.deepcoder", "DeepCoderEnv", _deepcoder_turn),
)


def _own_expert(env_cls: type):
    """The class's own `expert_turn` (TextEnv's hook for an env of your own), where it overrides
    TextEnv's default (which comes back here); it takes precedence over the table above."""
    method = getattr(env_cls, "expert_turn", None)
    if method is None or method is TextEnv.expert_turn:
        return None
    import inspect

    takes_turns = "turns_left" in inspect.signature(method).parameters  # `def expert_turn(self)` is fine too

    def expert(env, turns_left):
        turn = method(env, turns_left=turns_left) if takes_turns else method(env)
        if not isinstance(turn, ExpertTurn) or isinstance(turn.actions, str):
            raise TypeError(f"{env_cls.__name__}.expert_turn returned {turn!r}: return "
                            "envs.experts.ExpertTurn(actions=(action, ...), grounded=text)")
        return turn

    return expert


def _expert_for(env_cls: type):
    import importlib

    own = _own_expert(env_cls)
    if own is not None:
        return own
    for module, name, expert in _EXPERTS:
        if issubclass(env_cls, getattr(importlib.import_module(module), name)):
            return expert
    return None


def has_expert(env_or_name) -> bool:
    """Whether `expert_turn` can play this env (an env, an env class, or a registered name)."""
    if isinstance(env_or_name, TextEnv):
        return _expert_for(type(env_or_name)) is not None
    if isinstance(env_or_name, type):
        return issubclass(env_or_name, TextEnv) and _expert_for(env_or_name) is not None
    from envs.registry import spec

    return _expert_for(spec(env_or_name).env_cls) is not None


def expert_turn(env: TextEnv, *, turns_left: int | None = None) -> ExpertTurn:
    """The expert's next turn from `env`'s current state (see the module docstring for each
    env's guarantee). `turns_left`: the turns the caller still allows, None for no limit."""
    expert = _expert_for(type(env))
    if expert is None:
        known = ", ".join(name for _, name, _ in _EXPERTS)
        raise NoExpertError(f"{type(env).__name__} has no expert policy; experts exist for: {known}; "
                            "an env of your own: override its expert_turn (docs/custom_env.md)")
    if env.episode_over:
        raise EpisodeOverError("the episode is over (or never started): call reset() before expert_turn()")
    if turns_left is not None and turns_left < 1:
        raise ValueError(f"turns_left must be >= 1 or None, got {turns_left}")
    return expert(env, turns_left)
