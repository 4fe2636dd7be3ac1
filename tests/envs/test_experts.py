"""Expert policies (envs/experts.py): each expert replayed through the env's own step()."""

import itertools
import math

import numpy as np
import pytest

import envs
from envs.countdown import evaluate_expression, score_answer
from envs.experts import (TEMPLATE_REASONING, ExpertTurn, NoExpertError, countdown_solution, expert_turn,
                          has_expert, lake_success_probability)
from envs.frozen_lake import FrozenLakeConfig, FrozenLakeEnv, transition_table
from envs.parsing import ACTION_SEPARATOR
from envs.sokoban_solver import shortest_solution


def response(env, turn: ExpertTurn) -> str:
    answer = f"<answer>{f' {ACTION_SEPARATOR} '.join(turn.actions)}</answer>"
    return f"<think>{turn.grounded}</think>{answer}" if env.config.require_think else answer


def check_turn(env, turn: ExpertTurn) -> None:
    assert 1 <= len(turn.actions) <= min(env.config.max_actions_per_turn, env.actions_left)
    vocabulary = env.action_vocabulary
    if vocabulary is not None:
        assert set(turn.actions) <= set(vocabulary)
    assert turn.template == TEMPLATE_REASONING
    assert 0 < len(turn.grounded.split()) <= 45, turn.grounded
    assert "</think>" not in turn.grounded and "<answer>" not in turn.grounded


def play(env, seed, rollout_index=0, turns=None, turn_limited=False):
    """One expert episode; returns (success, return, turns used, turns seen)."""
    env.reset(seed=seed, options={"rollout_index": rollout_index})
    total, seen, k = 0.0, [], 0
    info = {"success": False}
    while not env.episode_over and (turns is None or k < turns):
        turn = expert_turn(env, turns_left=(turns - k) if turn_limited else None)
        check_turn(env, turn)
        seen.append(turn)
        _, reward, _, _, info = env.step(response(env, turn))
        assert info["format_penalty"] == 0.0 and info["actions_executed"] == list(turn.actions)[:len(
            info["actions_executed"])]
        total += reward
        k += 1
    return bool(info["success"]), total, k, seen


# --- Sokoban ------------------------------------------------------------------------------

def test_sokoban_solves_200_rooms_with_a_shortest_solution():
    # 200 rooms solvable within the 10-move budget; a room needing more (0.2% of RAGEN-2's,
    # seed 119 here needs 11) is one no policy can solve, so it is counted, not replayed.
    env = envs.make("sokoban")
    solved, over_budget, seed = 0, [], 0
    while solved < 200:
        env.reset(seed=seed)
        optimal = shortest_solution(env.fixed, env.dim_y, env.boxes, env.player)
        if len(optimal) > env.config.max_actions_per_traj:
            over_budget.append(seed)
        else:
            success, _, _, seen = play(env, seed)
            assert success and sum(len(t.actions) for t in seen) == len(optimal), seed
            solved += 1
        seed += 1
    assert over_budget == [119]


@pytest.mark.parametrize("name", ["larger_sokoban", "sokoban_different_grid_vocab", "sokoban_coord"])
def test_sokoban_variants_solve_every_room_solvable_in_budget(name):
    env = envs.make(name)
    solvable = solved = 0
    for seed in range(20):
        env.reset(seed=seed)
        optimal = shortest_solution(env.fixed, env.dim_y, env.boxes, env.player,
                                    max_depth=env.config.max_actions_per_traj)
        success = play(env, seed)[0]
        solvable += optimal is not None
        solved += success
        assert success == (optimal is not None), seed  # solved exactly when some solution fits
    assert solvable >= 15


def test_sokoban_over_budget_and_stuck_rooms_still_get_a_valid_turn():
    env = envs.make("sokoban", max_actions_per_traj=2)
    env.load_room(["######", "#P___#", "#_X__#", "#___O#", "######"])  # needs more than 2 moves
    turn = expert_turn(env)
    check_turn(env, turn)
    assert "more than the 2 I have" in turn.grounded
    env.load_room(["#####", "#X_O#", "#P__#", "#####"])  # box in a corner: unsolvable
    turn = expert_turn(env)
    check_turn(env, turn)
    assert "No sequence" in turn.grounded


# --- FrozenLake ---------------------------------------------------------------------------

def bfs_length(rows) -> int | None:
    """Shortest hole-free path S -> G, written apart from the expert's search."""
    cells = {(r, c): t for r, row in enumerate(rows) for c, t in enumerate(row)}
    start = next(p for p, t in cells.items() if t == "S")
    frontier, seen, depth = [start], {start}, 0
    while frontier:
        if any(cells[p] == "G" for p in frontier):
            return depth
        nxt = []
        for r, c in frontier:
            for p in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
                if p in cells and p not in seen and cells[p] != "H":
                    seen.add(p)
                    nxt.append(p)
        frontier, depth = nxt, depth + 1
    return None


def test_deterministic_lake_solves_every_seed_on_a_shortest_path():
    env = envs.make("frozen_lake", success_rate=1.0)
    for seed in range(200):
        env.reset(seed=seed)
        shortest = bfs_length(env.map)
        assert lake_success_probability(env) == 1.0
        success, _, turns, seen = play(env, seed)
        assert success, seed
        assert sum(len(t.actions) for t in seen) == shortest
        assert turns == math.ceil(shortest / env.config.max_actions_per_turn)  # two moves a turn


def slippery_replay(seeds, rollouts, turns=None):
    """(empirical success, mean optimal value, standard error) over seeds x rollouts."""
    env = envs.make("frozen_lake")  # success_rate 0.8
    wins, values = 0, []
    for seed in seeds:
        env.reset(seed=seed)
        value = lake_success_probability(env, turns_left=turns)
        for g in range(rollouts):
            wins += play(env, seed, g, turns=turns, turn_limited=turns is not None)[0]
            values.append(value)
    values = np.array(values)
    return wins / len(values), values.mean(), math.sqrt((values * (1 - values)).sum()) / len(values)


def test_slippery_lake_success_matches_the_optimal_value():
    # Episodes are independent Bernoulli(V_i), so the success share has mean mean(V) and
    # standard error sqrt(sum V_i (1 - V_i)) / n; 3 standard errors bound a correct expert.
    empirical, optimal, se = slippery_replay(range(300), 8)
    assert abs(empirical - optimal) <= 3 * se, (empirical, optimal, se)
    assert 0.5 < optimal < 1.0


def test_slippery_lake_with_a_turn_limit_matches_its_optimal_value():
    empirical, optimal, se = slippery_replay(range(150), 8, turns=5)  # RAGEN-2's 5 turns x 2 actions
    assert abs(empirical - optimal) <= 3 * se, (empirical, optimal, se)


def brute_force_open_loop(rows, rate, start, length) -> float:
    """max over every open-loop sequence of `length` moves of P(goal): independent of the planner."""
    table, best = transition_table(rows, rate), 0.0
    for seq in itertools.product(range(4), repeat=length):
        live, goal = {start: 1.0}, 0.0
        for a in seq:
            nxt = {}
            for s, mass in live.items():
                for p, s2, reward, done in table[s][a]:
                    if reward > 0:
                        goal += mass * p
                    elif not done:
                        nxt[s2] = nxt.get(s2, 0.0) + mass * p
            live = nxt
        best = max(best, goal)
    return best


def test_turn_planner_equals_brute_force_and_turns_never_hurt():
    rows = ("SFF", "FHF", "FFG")
    for per_turn in (2, 3):
        env = FrozenLakeEnv(FrozenLakeConfig(fixed_map=rows, max_actions_per_turn=per_turn, max_actions_per_traj=per_turn))
        env.reset(seed=0)
        one_turn = lake_success_probability(env, turns_left=1)
        assert one_turn == pytest.approx(brute_force_open_loop(rows, 0.8, 0, per_turn), abs=1e-12)
        assert one_turn <= lake_success_probability(env) + 1e-12  # closed loop is at least as good
    env = FrozenLakeEnv(FrozenLakeConfig(fixed_map=rows))
    env.reset(seed=0)
    values = [lake_success_probability(env, turns_left=k) for k in range(1, 11)]
    assert all(a <= b + 1e-12 for a, b in zip(values, values[1:]))
    assert values[-1] == pytest.approx(lake_success_probability(env))


def test_slippery_lake_plays_one_move_a_turn_without_a_turn_limit():
    env = envs.make("frozen_lake")
    for seed in range(20):
        env.reset(seed=seed)
        assert len(expert_turn(env).actions) == 1


# --- every expert -------------------------------------------------------------------------

GAMES = [("sokoban", {}), ("frozen_lake", {}), ("frozen_lake", {"success_rate": 1.0, "require_think": False}),
         ("searchqa", {}), ("metamathqa", {"max_actions_per_traj": 3})]


@pytest.mark.parametrize("name,overrides", GAMES)
def test_expert_plays_from_states_random_actions_reached(name, overrides):
    env = envs.make(name, **overrides)
    rng = np.random.default_rng(0)
    played = 0
    for seed in range(30):
        env.reset(seed=seed)
        for _ in range(int(rng.integers(1, 5))):
            if env.episode_over:
                break
            env.step(response(env, ExpertTurn((env.sample_action(rng),), "random")))
        if env.episode_over:
            with pytest.raises(envs.EpisodeOverError):
                expert_turn(env)
            continue
        before = env.render()
        turn = expert_turn(env)
        assert env.render() == before  # planning leaves the game untouched
        check_turn(env, turn)
        assert expert_turn(env) == turn  # a function of the state alone
        env.step(response(env, turn))
        played += 1
    assert played >= 10


@pytest.mark.parametrize("name,overrides", GAMES)
def test_grounded_text_differs_where_actions_differ_and_template_never(name, overrides):
    env = envs.make(name, **overrides)
    by_actions: dict = {}
    for seed in range(60):
        env.reset(seed=seed)
        turn = expert_turn(env)
        assert turn.template == TEMPLATE_REASONING
        by_actions.setdefault(turn.actions, set()).add(turn.grounded)
    assert len(by_actions) >= 3
    for first, second in itertools.combinations(by_actions, 2):
        assert not by_actions[first] & by_actions[second]  # no text shared by turns that act differently


def test_grounded_text_states_what_the_observation_shows():
    env = envs.make("frozen_lake", success_rate=1.0, fixed_map=("SFH", "FFF", "HFG"))
    env.reset(seed=0)
    turn = expert_turn(env)
    assert turn.grounded.startswith("At (0, 0), goal (2, 2).")
    assert turn.actions == ("Down", "Right") or turn.actions == ("Right", "Down")
    env = envs.make("sokoban")
    env.load_room(["######", "#P___#", "#_X__#", "#___O#", "######"])
    assert expert_turn(env).grounded.startswith("At (1, 1). Box (2, 2) to (3, 4).")


def test_has_expert_and_no_expert_error():
    without = {spec.name for spec in envs.specs() if not has_expert(spec.name)}
    assert without == {"webshop"}  # every other shipped env, and every variant, has an expert
    assert has_expert("LargerSokoban") and has_expert(envs.make("frozen_lake")) and has_expert(FrozenLakeEnv)
    assert not has_expert(int)
    assert issubclass(NoExpertError, ValueError)
    with pytest.raises(NoExpertError, match="no expert policy"):
        expert_turn(envs.make("webshop"))


# --- single-answer envs and SearchQA ------------------------------------------------------

def test_countdown_solves_every_instance_it_finds_solvable():
    env = envs.make("countdown")
    solvable = 0
    for seed in range(200):
        env.reset(seed=seed)
        solvable += countdown_solution(env.numbers, env.target) is not None
        success, total, _, _ = play(env, seed)
        assert success and total == env.config.score, seed
    assert solvable == 200  # the generator builds every target from its numbers


def brute_force_three(numbers) -> set:
    """Every value an expression over three numbers (each once) can take: both bracketings of
    every order and operator pair, evaluated by the env's own evaluator."""
    values = set()
    for a, b, c in itertools.permutations(numbers):
        for o1, o2 in itertools.product("+-*/", repeat=2):
            for text in (f"({a} {o1} {b}) {o2} {c}", f"{a} {o1} ({b} {o2} {c})"):
                value = evaluate_expression(text).value
                if value is not None:
                    values.add(value)
    return values


def test_countdown_search_is_exhaustive_and_says_when_nothing_works():
    rng = np.random.default_rng(0)
    for _ in range(12):
        numbers = tuple(int(n) for n in rng.integers(1, 13, size=3))
        reachable = brute_force_three(numbers)
        for target in range(1, 80):
            found = countdown_solution(numbers, target)
            assert (found is not None) == (target in reachable), (numbers, target)
            if found is not None:
                assert score_answer(found, numbers, target).correct
    assert countdown_solution((1, 1), 7) is None
    env = envs.make("countdown")
    env.reset(seed=0)
    env.numbers, env.target = (1, 1), 7  # no expression works: a well-formed answer, said plainly
    turn = expert_turn(env)
    assert turn.grounded.startswith("No expression") and score_answer(turn.actions[0], (1, 1), 7).reward == 0.1


@pytest.mark.parametrize("name", ["bandit", "bandit_test", "bandit_rev"])
def test_bandit_pulls_the_arm_with_the_higher_mean(name):
    env = envs.make(name)
    for seed in range(40):
        env.reset(seed=seed)
        config = env.config
        means = {env.high_risk_arm: config.high_risk_expected_payoff, env.low_risk_arm: config.low_risk_payoff}
        assert expert_turn(env).actions == (max(means, key=means.get),)
        assert play(env, seed)[0]


@pytest.mark.parametrize("name", ["metamathqa", "metamathqa_math"])
def test_metamathqa_answers_the_dataset_label_for_full_reward(name):
    env = envs.make(name)
    for seed in range(60):
        env.reset(seed=seed)
        assert expert_turn(env).actions == (env.problem.label,)
        success, total, turns, _ = play(env, seed)
        assert success and total == 1.0 and turns == 1, seed


def test_searchqa_searches_supporting_paragraphs_then_gives_the_gold_answer():
    env = envs.make("searchqa")
    for seed in range(30):
        env.reset(seed=seed)
        titles, searched = env.question.supporting_titles, []
        while not (turn := expert_turn(env)).actions[0].startswith("finish["):
            searched.append(turn.actions[0])
            env.step(response(env, turn))
        # It answers only once the last supporting paragraph is on screen, having searched the
        # titles in order (skipping one an earlier search already showed).
        assert titles[-1] in {p.title for _, passages in env.results for p in passages}, seed
        assert searched and searched == [f"search[{t}]" for t in titles if f"search[{t}]" in searched], seed
        assert turn.actions == (f"finish[{env.question.answer}]",)
        _, reward, _, _, info = env.step(response(env, turn))
        assert info["success"] and reward == 1.0, seed
    env = envs.make("searchqa", max_actions_per_traj=1)  # no room to search: answer at once
    env.reset(seed=0)
    assert expert_turn(env).actions == (f"finish[{env.question.answer}]",)


def test_deepcoder_submits_the_reference_solution():
    env = envs.make("deepcoder")
    for seed in range(3):
        success, total, _, _ = play(env, seed)
        assert success and total == 1.0, seed
