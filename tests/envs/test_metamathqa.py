"""MetaMathQA: answer scoring (strict vs math), the loaders and their errors, and episodes."""

import json
import sys
import threading
import time
import types
import uuid

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
import envs.metamathqa as metamathqa
from envs.base import EnvConfigError
from envs.math_answers import answers_match, extract_label, parse_number
from envs.metamathqa import MathDatasetError, MetaMathQAConfig, MetaMathQAEnv
from envs.parsing import format_response


def row(query: str, label: str, type_: str = "GSM_AnsAug") -> dict:
    return {"type": type_, "query": query, "original_question": query,
            "response": f"Some steps.\n#### {label}\nThe answer is: {label}"}


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def file_env(path: str, **overrides) -> MetaMathQAEnv:
    return MetaMathQAEnv(MetaMathQAConfig(source="file", path=path, **overrides))


def answer(env, text):
    return env.step(format_response([text], think="t"))


# --- answers -------------------------------------------------------------------------------

@pytest.mark.parametrize("response, label", [
    ("Janet sells 9 eggs.\n#### 18\nThe answer is: 18", "18"),
    ("So $x = \\frac{1}{2}$.\nThe answer is: \\frac{1}{2}", "\\frac{1}{2}"),
    ("The answer is: 3 and again The answer is: 4\n", "4"),  # the last marker wins
    ("The answer is:   \n", None),
    ("#### 18", None),
])
def test_extract_label(response, label):
    assert extract_label(response) == label


@pytest.mark.parametrize("answer_text, label, strict, math", [
    ("18", "18", True, True),
    (" 1 8 ", "18", True, True),                 # strict deletes all whitespace
    ("MONDAY", "Monday", True, True),
    ("(1, 2)", "(1,2)", True, True),
    ("1,500", "1500", False, True),
    ("1500", "1,500", False, True),
    ("\\boxed{5}", "5", False, True),
    ("0.5", "1/2", False, True),
    ("0.5", "\\frac{1}{2}", False, True),
    ("-\\dfrac12", "-0.5", False, True),
    ("$18", "18", False, True),
    ("\\$18.00", "18", False, True),
    ("18.00", "18", False, True),
    ("-3", "-3.0", False, True),
    ("$\\frac{3}{4}$", "0.75", False, True),
    ("x = 5", "5", False, True),
    ("25\\%", "25", False, True),
    ("18.", "18", False, True),
    ("\\text{Monday}", "Monday", False, True),
    ("17", "18", False, False),
    ("-18", "18", False, False),
    ("", "18", False, False),
    ("1/0", "0", False, False),
    ("(2,1)", "(1,2)", False, False),
    ("1,50", "150", False, False),               # not a thousands separator
    ("\\boxed{5", "5", False, False),
    ("5$5", "55", False, False),                  # a `$` inside a number is not stripped
    ("$5$5", "55", False, False),
    ("5$", "5", False, False),
    ("$5$", "5", False, True),                    # delimiting $…$ is peeled
    ("$$5$$", "5", False, True),
    ("-$5", "-5", False, True),                   # currency sign after the minus
])
def test_strict_and_math_scoring(answer_text, label, strict, math):
    assert answers_match(answer_text, label, "strict") is strict
    assert answers_match(answer_text, label, "math") is math


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30), st.text(max_size=30))
def test_math_accepts_everything_strict_accepts(a, b):
    if answers_match(a, b, "strict"):
        assert answers_match(a, b, "math")
    assert answers_match(a, a, "math") is bool(a.strip())


def test_hostile_answers_are_cheap_and_never_raise():
    start = time.perf_counter()
    for text in ("1" * 100_000, "$" * 100_000, "\\boxed{" * 5000, "9" * 5000 + "/1", "1e999999", "\udcff"):
        assert answers_match(text, "18", "math") is False
        assert answers_match(text, "18", "strict") is False
    assert parse_number("9" * 5000) is None  # past int()'s digit limit: not a number, not an error
    assert time.perf_counter() - start < 2.0


def test_unknown_scoring_mode_is_rejected():
    with pytest.raises(ValueError, match="unknown scoring mode 'fuzzy'"):
        answers_match("1", "1", "fuzzy")


# --- data ----------------------------------------------------------------------------------

def test_builtin_data_is_the_gsm8k_sample_in_metamathqa_schema():
    problems = metamathqa.load_problems(MetaMathQAConfig())
    assert len(problems) == 200
    assert problems[0].query.startswith("Janet’s ducks lay 16 eggs") and problems[0].label == "18"
    assert problems[1].label == "3" and problems[0].type == "GSM8K_test"
    assert sum(p.label == "2,125" for p in problems) == 1


def test_loader_reads_jsonl_and_json_and_the_rng_picks_the_instance(tmp_path):
    rows = [row("What is 2+2?", "4"), row("Half of 1?", "\\frac{1}{2}"), row("10 * 150?", "1,500")]
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text(json.dumps(rows[0]) + "\n\n" + "".join(json.dumps(r) + "\n" for r in rows[1:]))
    json_array = tmp_path / "rows.json"
    json_array.write_text(json.dumps(rows, indent=1))
    for path in (jsonl, json_array):
        env = file_env(str(path))
        assert [p.label for p in env.problems] == ["4", "\\frac{1}{2}", "1,500"]
        seen = set()
        for seed in range(30):
            obs, info = env.reset(seed=seed)
            assert info["index"] == int(np.random.default_rng(seed).integers(3))
            assert obs == rows[info["index"]]["query"] and info["type"] == "GSM_AnsAug"
            seen.add(info["index"])
        assert seen == {0, 1, 2}


@pytest.mark.parametrize("lines, message", [
    ([row("q", "1"), {"type": "x", "query": "q2", "original_question": "q2"}],
     "row 2 (line 2): missing field 'response'"),
    ([row("q", "1"), row("q", "2"), {"query": "q3", "response": "It is 5. #### 5"}],
     "row 3 (line 3): 'response' has no final answer after 'The answer is:'"),
    ([{"response": "The answer is: 1"}], "row 1 (line 1): missing field 'query'"),
    ([{"query": "q", "response": 5}], "row 1 (line 1): field 'response' must be a string, got int"),
    ([{"query": "  ", "response": "The answer is: 1"}], "row 1 (line 1): 'query' is empty"),
    ([["q", "The answer is: 1"]], "row 1 (line 1): expected a JSON object, got list"),
])
def test_bad_rows_name_the_file_and_row(tmp_path, lines, message):
    path = write_jsonl(tmp_path / "bad.jsonl", lines)
    with pytest.raises(MathDatasetError) as caught:
        file_env(path)
    assert str(path) in str(caught.value) and message in str(caught.value)


def test_bad_files_name_the_file(tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(row("q", "1")) + "\n{not json\n")
    with pytest.raises(MathDatasetError, match=r"broken\.jsonl: row 2 \(line 2\): not valid JSON"):
        file_env(str(broken))
    array = tmp_path / "array.json"
    array.write_text(json.dumps([row("q", "1"), {"query": "q"}]))
    with pytest.raises(MathDatasetError, match=r"array\.json: row 2: missing field 'response'"):
        file_env(str(array))
    not_a_list = tmp_path / "object.json"
    not_a_list.write_text(json.dumps({"train": [row("q", "1")]}))
    with pytest.raises(MathDatasetError, match=r"object\.json: row 1 \(line 1\): missing field 'query'"):
        file_env(str(not_a_list))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(MathDatasetError, match=r"empty\.jsonl: holds no rows"):
        file_env(str(empty))
    with pytest.raises(MathDatasetError, match=r"missing\.jsonl: no such file"):
        file_env(str(tmp_path / "missing.jsonl"))


def test_file_is_loaded_once_even_from_many_threads(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "once.jsonl", [row("q", "1")])
    calls = []
    real_read = metamathqa.read_problem_file

    def slow_counting_read(file_path):
        calls.append(file_path)
        time.sleep(0.05)  # widen the window in which an unlocked cache would load twice
        return real_read(file_path)

    monkeypatch.setattr(metamathqa, "read_problem_file", slow_counting_read)
    built = []
    workers = [threading.Thread(target=lambda: built.append(file_env(path))) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(built) == 8 and len(calls) == 1
    assert all(env.problems is built[0].problems for env in built)


class FakeHubDataset(list):
    """What `datasets.load_dataset(..., split=...)` returns, as far as the env uses it."""

    @property
    def column_names(self):
        return list(self[0]) if self else []


def fake_datasets_module(load_dataset) -> types.ModuleType:
    # A stand-in module: importing the real `datasets` costs seconds, and no test may reach the hub.
    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset
    return module


def test_hub_source_loads_lazily_through_datasets_and_caches(monkeypatch):
    hub_id = f"test/fake-{uuid.uuid4().hex}"  # a fresh cache key
    calls = []

    def fake_load_dataset(path, split=None, cache_dir=None):
        calls.append((path, split, cache_dir))
        return FakeHubDataset([row("Hub question?", "7", "MATH_FOBAR")])

    monkeypatch.setitem(sys.modules, "datasets", fake_datasets_module(fake_load_dataset))
    env = MetaMathQAEnv(MetaMathQAConfig(source="hub", hub_id=hub_id, split="test", cache_dir="/tmp/c"))
    MetaMathQAEnv(MetaMathQAConfig(source="hub", hub_id=hub_id, split="test", cache_dir="/tmp/c"))
    assert calls == [(hub_id, "test", "/tmp/c")]
    obs, info = env.reset(seed=0)
    assert obs == "Hub question?" and info["type"] == "MATH_FOBAR"
    assert answer(env, "7")[1] == 1.0


def test_hub_rows_are_checked_when_read_and_columns_when_loaded(monkeypatch):
    rows = FakeHubDataset([{"query": "q", "response": "no final answer"}])
    monkeypatch.setitem(sys.modules, "datasets", fake_datasets_module(lambda *a, **k: rows))
    hub_id = f"test/bad-{uuid.uuid4().hex}"
    env = envs.make("metamathqa", source="hub", hub_id=hub_id)
    with pytest.raises(MathDatasetError, match=f"hub dataset '{hub_id}' split 'train': row 0: 'response' has no"):
        env.reset(seed=0)
    no_response = FakeHubDataset([{"query": "q", "answer": "1"}])
    monkeypatch.setitem(sys.modules, "datasets", fake_datasets_module(lambda *a, **k: no_response))
    with pytest.raises(MathDatasetError, match=r"missing column\(s\) \['response'\]"):
        envs.make("metamathqa", source="hub", hub_id=hub_id + "-2")


def test_hub_unreachable_gives_a_clear_error(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'meta-math/MetaMathQA' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setitem(sys.modules, "datasets", fake_datasets_module(offline))
    hub_id = f"test/offline-{uuid.uuid4().hex}"
    with pytest.raises(MathDatasetError) as caught:
        envs.make("metamathqa", source="hub", hub_id=hub_id)
    message = str(caught.value)
    assert f"could not load hub dataset '{hub_id}' split 'train'" in message
    assert "ConnectionError" in message and "source='builtin'" in message


@pytest.mark.parametrize("overrides, message", [
    ({"source": "web"}, "source must be one of ['builtin', 'file', 'hub'], got 'web'"),
    ({"source": "file"}, "source='file' needs path="),
    ({"path": "x.jsonl"}, "path is only read with source='file'"),
    ({"source": "hub", "hub_id": ""}, "source='hub' needs a non-empty hub_id and split"),
    ({"scoring": "fuzzy"}, "scoring must be one of ['strict', 'math'], got 'fuzzy'"),
])
def test_bad_config_values_name_the_problem(overrides, message):
    with pytest.raises(EnvConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        MetaMathQAConfig(**overrides)


# --- episodes ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["metamathqa", "metamathqa_math"])
def test_registered_variants_pass_the_checker(name):
    envs.check_env(lambda: envs.make(name))


def test_registered_defaults_and_names():
    assert envs.make("MetaMathQA").config == MetaMathQAConfig()
    assert envs.make("metamath").config == MetaMathQAConfig()
    assert envs.make("metamathqa-math").config == MetaMathQAConfig(scoring="math")
    config = envs.make("metamathqa").config
    assert (config.max_actions_per_traj, config.max_actions_per_turn, config.scoring) == (1, 1, "strict")


def test_multi_turn_config_passes_the_checker():
    envs.check_env(lambda: envs.make("metamathqa", max_actions_per_traj=3))


def test_single_turn_episode_right_and_wrong(tmp_path):
    env = file_env(write_jsonl(tmp_path / "one.jsonl", [row("What is 6*3?", "18")]))
    assert env.reset(seed=5)[0] == "What is 6*3?"
    obs, reward, terminated, truncated, info = answer(env, "18")
    assert (obs, reward, terminated, truncated, info["success"]) == ("Correct!", 1.0, True, False, True)
    env.reset(seed=5)
    obs, reward, terminated, truncated, info = answer(env, "17")
    # As in RAGEN, a wrong answer does not terminate: the one-answer budget truncates.
    assert (obs, reward, terminated, truncated, info["success"]) == (
        "Incorrect. Please think again.", 0.0, False, True, False)
    assert info["action_infos"] == [{"correct": False, "attempt": 0, "label": "18"}]


def test_multi_turn_reward_halves_with_each_attempt(tmp_path):
    env = file_env(write_jsonl(tmp_path / "one.jsonl", [row("What is 6*3?", "18")]), max_actions_per_traj=3)
    env.reset(seed=0)
    assert answer(env, "17")[1:4] == (0.0, False, False)
    assert env.render() == "Incorrect. Please think again."
    assert answer(env, "16")[1:4] == (0.0, False, False)
    obs, reward, terminated, truncated, info = answer(env, "18")
    assert (obs, reward, terminated, truncated, info["success"]) == ("Correct!", 0.25, True, False, True)
    env.reset(seed=0)
    answer(env, "0")
    assert answer(env, "18")[1] == 0.5


def test_scoring_mode_decides_a_comma_label(tmp_path):
    path = write_jsonl(tmp_path / "comma.jsonl", [row("10 * 150?", "1,500")])
    for scoring, reward in (("strict", 0.0), ("math", 1.0)):
        env = file_env(path, scoring=scoring)
        env.reset(seed=0)
        assert answer(env, "$1500")[1] == reward
        env.reset(seed=0)
        assert answer(env, "1,500")[1] == 1.0


def test_sample_action_is_a_number_and_sometimes_the_label():
    env = envs.make("metamathqa")
    env.reset(seed=3)
    samples = [env.sample_action(np.random.default_rng(s)) for s in range(200)]
    assert all(s.lstrip("-").replace(",", "").isdigit() for s in samples)
    hits = sum(s == env.problem.label for s in samples)
    assert 20 <= hits <= 90  # about a quarter, plus the odd random hit
