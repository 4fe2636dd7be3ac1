"""DeepCoder: test layouts, judging, the shipped problems, episodes, sources and config."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import envs
import envs.deepcoder as deepcoder
from envs import sandbox
from envs.base import EnvConfigError
from envs.data_files import SourceCache
from envs.deepcoder import (CodeDatasetError, CodeTest, DeepCoderConfig, DeepCoderEnv, extract_code, json_equal,
                            parse_tests, run_test)
from envs.parsing import format_response
from envs.registry import BUILTIN_MODULES
from envs.sandbox import SandboxLimits

LIMITS = SandboxLimits(cpu_seconds=1, wall_seconds=4)


def answer(env, code: str):
    return env.step(format_response([code], think="t"))


def reset_to(env, problem_id: str) -> str:
    """Reset with the first seed that draws `problem_id`; return the observation."""
    for seed in range(2000):
        obs, info = env.reset(seed=seed)
        if info["problem_id"] == problem_id:
            return obs
    raise AssertionError(f"no seed draws {problem_id}")


# --- test layouts ------------------------------------------------------------------------

@pytest.mark.parametrize("raw, metadata, expected", [
    ([{"type": "stdin_stdout", "input": "1\n", "output": "2\n"}], None, [CodeTest("stdio", "1\n", "2\n")]),
    ([{"type": "function_call", "fn_name": "f", "input": [1, 2], "output": [3]}], None,
     [CodeTest("call", [1, 2], [3], "f", wrapped=True)]),
    ({"inputs": [[1, 2], [5, 5]], "outputs": [[3], [10]], "fn_name": "f"}, None,  # TACO
     [CodeTest("call", [1, 2], [3], "f", True), CodeTest("call", [5, 5], [10], "f", True)]),
    ({"inputs": ["x\n"], "outputs": [["a", "b"]]}, None, [CodeTest("stdio", "x\n", "a\nb")]),  # lines as a list
    ([{"input": "[1, 2]\n3", "output": "[4]", "testtype": "functional", "metadata": {"func_name": "g"}}], None,
     [CodeTest("call", [[1, 2], 3], [4], "g", wrapped=False)]),  # LiveCodeBench
    ('[{"input": "\\"ab\\"", "output": "true", "testtype": "functional"}]', '{"func_name": "h"}',
     [CodeTest("call", ["ab"], True, "h")]),  # JSON strings; the name from the row's metadata
    ([{"input": "5\n", "output": "25\n", "testtype": "stdin"}], None, [CodeTest("stdio", "5\n", "25\n")]),
])
def test_parse_tests_reads_deepcoder_taco_and_livecodebench(raw, metadata, expected):
    assert list(parse_tests(raw, metadata, "row 1")) == expected


@pytest.mark.parametrize("raw, message", [
    ([], "'tests' must be a non-empty list"),
    ("{not json", "'tests' is not valid JSON"),
    ([{"input": "1"}], "test 1: expected an object with 'input' and 'output'"),
    ([{"type": "stdin_stdout", "input": "1", "output": "1"}, {"type": "pytest", "input": "", "output": ""}],
     "test 2: unknown test type 'pytest'"),
    ([{"type": "function_call", "input": [1], "output": [1]}], "test 1: a function-call test needs fn_name"),
    ([{"type": "function_call", "fn_name": "os.system", "input": [1], "output": [1]}], "needs fn_name"),
    ({"inputs": ["1", "2"], "outputs": ["1"]}, "2 inputs but 1 outputs"),
    ([{"type": "stdin_stdout", "input": 5, "output": "5"}], "stdin/stdout tests need text, got int"),
    ({"inputs": "1", "outputs": "1"}, "'inputs' and 'outputs' must be lists"),
    ([{"input": "not json", "output": "1", "testtype": "functional", "metadata": {"func_name": "g"}}],
     "an argument line is not valid JSON"),
])
def test_malformed_tests_say_where(raw, message):
    with pytest.raises(CodeDatasetError, match="row 7") as caught:
        parse_tests(raw, None, "row 7")
    assert message in str(caught.value)


@pytest.mark.parametrize("text, code", [
    ("print(1)", "print(1)"),
    ("```python\nprint(1)\n```", "print(1)"),
    ("Here:\n```py\nx = 1\n```\nand better:\n```python\nx = 2\n```\n", "x = 2"),  # the last block
    ("```\n    if True:\n        pass\n```", "if True:\n    pass"),  # dedented
    ("```python\nprint(2)\n", "print(2)"),  # an unclosed fence runs to the end
    ("\n    a = 1\n    print(a)\n", "a = 1\nprint(a)"),
])
def test_extract_code(text, code):
    assert extract_code(text) == code


@pytest.mark.parametrize("a, b, equal", [
    (1, 1.0, True), (True, 1, False), (False, 0, False), (True, True, True), ([1, [2]], (1, [2]), True),
    ({"a": [1]}, {"a": [1.0]}, True), ({"a": 1}, {"a": 1, "b": 2}, False), ("1", 1, False), (None, None, True),
])
def test_json_equal(a, b, equal):
    assert json_equal(a, b) is equal


# --- judging one test ----------------------------------------------------------------------

ECHO_SUM = "import sys\nprint(sum(map(int, sys.stdin.read().split())))"


@pytest.mark.parametrize("code, test, verdict, message", [
    ("print('1  2 \\n3\\n\\n')", CodeTest("stdio", "", "1 2\n3\n"), "ok", "output matches"),  # whitespace
    ("print('1 2 3')", CodeTest("stdio", "", "1 2\n3\n"), "wrong_answer", "expected '1 2\\n3', got '1 2 3'"),
    (ECHO_SUM, CodeTest("stdio", "4 5\n6\n", "15"), "ok", "output matches"),
    ("def f(a, b):\n    print('noise')\n    return a + b", CodeTest("call", [1, 2], [3], "f", True), "ok",
     "result matches"),
    ("def f(a, b):\n    return [a + b]", CodeTest("call", [1, 2], [3], "f", True), "ok", "result matches"),
    ("def f(a):\n    return 4", CodeTest("call", [1], [4], "f", False), "wrong_answer", "expected [4], got 4"),
    ("def f(a):\n    return 1", CodeTest("call", [1], [True], "f", True), "wrong_answer", "expected true, got 1"),
    ("class Solution:\n    def g(self, xs):\n        return sorted(xs)", CodeTest("call", [[3, 1]], [1, 3], "g"),
     "ok", "result matches"),
    ("def f():\n    return {1}", CodeTest("call", [], [1], "f", True), "runtime_error", "JSON cannot hold"),
    ("def other():\n    pass", CodeTest("call", [], [1], "f", True), "runtime_error", "defines no function 'f'"),
    ("import sys\nsys.exit(0)\ndef f():\n    return 1", CodeTest("call", [], [1], "f", True), "wrong_answer",
     "returned nothing"),
    ("def f():\n    return 1\nif __name__ == '__main__':\n    input()", CodeTest("call", [], [1], "f", True), "ok",
     "result matches"),  # a main block does not run
    # Hostile result lines written straight to the result pipe: too deep, or too many digits for the host.
    ("import os\nos.write(3, b'[' * 100000 + b']' * 100000 + b'\\n')\nos._exit(0)",
     CodeTest("call", [], [1], "f", True), "wrong_answer", "could not be read"),
    ("import os\nos.write(3, b'9' * 5000 + b'\\n')\nos._exit(0)", CodeTest("call", [], [1], "f", True),
     "wrong_answer", "could not be read"),
    ("def f():\n    x = []\n    for _ in range(100000):\n        x = [x]\n    return x", CodeTest("call", [], [1], "f"),
     "runtime_error", "RecursionError"),
])
def test_run_test_judges(code, test, verdict, message):
    outcome = run_test(code, test, LIMITS)
    assert outcome.verdict == verdict and message in outcome.message, outcome


def test_run_test_passes_sandbox_verdicts_through():
    outcome = run_test("import time\ntime.sleep(5)", CodeTest("stdio", "", ""), SandboxLimits(wall_seconds=0.5))
    assert outcome.verdict == "timeout" and "wall-clock limit of 0.5 s" in outcome.message


# --- the shipped problems ----------------------------------------------------------------

def test_builtin_problems_have_varied_tests_and_every_reference_passes_in_the_sandbox(monkeypatch):
    problems = deepcoder.load_problems(DeepCoderConfig())
    assert len(problems) == 31 and len({p.problem_id for p in problems}) == 31
    assert all(3 <= len(p.tests) <= 6 and p.solution.strip() for p in problems)
    kinds = [{t.kind for t in p.tests} for p in problems]
    assert kinds.count({"stdio"}) == 18 and kinds.count({"call"}) == 13
    jobs = [(p, test) for p in problems for test in p.tests]
    monkeypatch.setattr(sandbox, "_SLOTS", threading.BoundedSemaphore(4))  # start-up waits overlap
    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(lambda job: run_test(job[0].solution, job[1], SandboxLimits()), jobs))
    failed = [(p.problem_id, o.verdict, o.message) for (p, _), o in zip(jobs, outcomes) if not o.passed]
    assert len(jobs) == 126 and failed == []


# --- episodes ------------------------------------------------------------------------------

def test_reference_solution_scores_one_and_a_partial_program_a_fraction():
    env = envs.make("deepcoder")
    reset_to(env, "sum_two")
    obs, reward, terminated, truncated, info = answer(env, env.problem.solution)
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert obs == "Correct! All 4 tests passed."
    reset_to(env, "sum_two")  # tests: 1 2 -> 3, -5 5 -> 0, ... ; `print(3)` passes only the first
    obs, reward, terminated, truncated, info = answer(env, "print(3)")
    assert (reward, terminated, truncated, info["success"]) == (0.25, False, True, False)
    assert info["action_infos"][0]["verdicts"] == ["ok", "wrong_answer", "wrong_answer", "wrong_answer"]
    assert obs == "Incorrect. Passed 1/4 tests. Test 2 failed (wrong answer)."  # nothing of test 2 itself
    assert info["action_infos"][0]["first_failure"] == "test 2: expected '0', got '3'"  # the host's detail
    # what the four sandbox runs cost the host, which check_env tells apart from the env's own CPU
    assert 0 < info["action_infos"][0]["sandbox_host_cpu_seconds"] < 4 * 0.5
    verbose = envs.make("deepcoder", feedback="verbose")  # the old, farmable wording, opt-in only
    reset_to(verbose, "sum_two")
    obs = answer(verbose, "print(3)")[0]
    assert obs == "Incorrect. Passed 1/4 tests. Test 2 failed (wrong_answer: expected '0', got '3')."


def test_function_problems_fenced_answers_and_broken_code():
    env = envs.make("deepcoder")
    obs = reset_to(env, "add")
    assert obs.startswith("Write a function add(a, b)") and "The tests call add" in obs
    assert answer(env, "def add(a, b):\n    return 3")[1] == 0.25  # only add(1, 2) == 3
    reset_to(env, "add")
    assert answer(env, "Sure:\n```python\ndef add(a, b):\n    return a + b\n```")[1] == 1.0
    reset_to(env, "add")
    obs, reward, _, _, info = answer(env, "def add(a, b) return a + b")
    assert reward == 0.0 and set(info["action_infos"][0]["verdicts"]) == {"runtime_error"}
    assert "SyntaxError" in info["action_infos"][0]["first_failure"]
    # Parsed on the host from the code alone, so the policy may read why it does not compile.
    assert obs == ("Incorrect. Passed 0/4 tests. Test 1 failed (runtime error). "
                   "The program does not compile: line 1: expected ':'.")


def test_malformed_and_empty_answers_get_the_format_penalty():
    env = envs.make("deepcoder")
    env.reset(seed=0)
    for text in ("print(1)", "<think>x</think><answer>   </answer>"):
        _, reward, terminated, truncated, info = env.step(text)
        assert (reward, terminated, truncated, info["action_is_valid"]) == (-0.1, False, False, False)


def test_code_with_pipes_is_one_program():
    env = envs.make("deepcoder")
    reset_to(env, "sum_two")
    code = "a, b = map(int, input().split())\nprint(a + b)  # || not a separator"
    parsed = env.parse(format_response([code], think="t"))
    assert parsed.actions == (code,) and answer(env, code)[1] == 1.0


def test_programs_cannot_read_the_expected_outputs():
    env = envs.make("deepcoder")
    reset_to(env, "add")
    cheat = f"def add(a, b):\n    return len(open({str(deepcoder.BUILTIN_PATH)!r}).read())"
    _, reward, _, _, info = answer(env, cheat)
    assert reward == 0.0 and "FileNotFoundError" in info["action_infos"][0]["first_failure"]


def test_multi_turn_feedback_then_success_and_max_tests():
    env = envs.make("deepcoder", max_actions_per_traj=2)
    reset_to(env, "reverse_string")
    obs, reward, terminated, truncated, _ = answer(env, "print(input())")  # right only for palindromes
    assert (reward, terminated, truncated) == (0.5, False, False) and obs.startswith("Incorrect. Passed 2/4")
    obs, reward, terminated, truncated, info = answer(env, "print(input()[::-1])")
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    short = envs.make("deepcoder", max_tests=2)
    reset_to(short, "is_prime")
    assert answer(short, "print('YES')")[4]["action_infos"][0]["verdicts"] == ["ok", "wrong_answer"]


@pytest.mark.parametrize("overrides, message", [
    ({"max_actions_per_turn": 2}, "one program per turn"),
    ({"source": "web"}, "source must be one of"),
    ({"source": "file"}, "path= is needed"),
    ({"path": "x.jsonl"}, "path= is needed"),
    ({"memory_mb": 1}, "bad sandbox limits"),
    ({"cpu_seconds": 0}, "bad sandbox limits"),
    ({"parallel_tests": 0}, "parallel_tests must be an int >= 1"),
    ({"feedback": "full"}, "feedback must be one of"),
])
def test_bad_config_is_refused(overrides, message):
    with pytest.raises(EnvConfigError, match=message):
        envs.make("deepcoder", **overrides)


# --- sources -------------------------------------------------------------------------------

@pytest.fixture
def public_dir():
    """A world-readable directory: only the sandbox's allow-listed root keeps a program out of it."""
    directory = Path(tempfile.mkdtemp(prefix="ragen2-deepcoder-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory)


def test_file_source_reads_taco_and_livecodebench_rows_and_hides_the_file(tmp_path, public_dir):
    rows = [
        {"problem": "Square the number.", "tests": json.dumps({"inputs": ["3\n", "4\n"], "outputs": ["9\n", "16\n"]}),
         "solution": "print(int(input()) ** 2)"},
        {"question": "Return the max.", "starter_code": "class Solution:\n    def top(self, xs): ...",
         "tests": [{"input": "[1, 5, 2]", "output": "5", "testtype": "functional"}],
         "metadata": json.dumps({"func_name": "top"})},
    ]
    path = public_dir / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    path.chmod(0o644)
    env = envs.make("deepcoder", source="file", path=str(path))
    assert [p.statement for p in env.problems] == ["Square the number.", "Return the max."]
    assert env.hide_paths == (str(path),)
    reset_to(env, str(path) + ": row 2 (line 2)")
    assert "Starter code:\n```python\nclass Solution" in env.render()
    assert answer(env, "class Solution:\n    def top(self, xs):\n        return max(xs)")[1] == 1.0
    reset_to(env, str(path) + ": row 1 (line 1)")
    peek = f"import os\npath = {str(path)!r}\nprint(len(open(path).read()) if os.path.exists(path) else 0)"
    info = answer(env, peek)[4]  # the file is covered (and so is the temp dir): nothing to read
    assert info["action_infos"][0]["first_failure"] == "test 1: expected '9', got '0'"
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"problem": "no tests"}) + "\n")
    with pytest.raises(CodeDatasetError, match=r"broken\.jsonl: row 2 \(line 2\): missing 'tests'"):
        envs.make("deepcoder", source="file", path=str(broken))
    with pytest.raises(CodeDatasetError, match="no such file"):
        envs.make("deepcoder", source="file", path=str(tmp_path / "missing.jsonl"))


class FakeHubDataset:
    column_names = ["problem", "tests", "metadata"]
    cache_files = [{"filename": "/nonexistent/cache/data-00000.arrow"}]

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]


def test_hub_source_uses_the_configured_id_config_and_split(monkeypatch):
    calls = []
    rows = [{"problem": "Echo.", "tests": json.dumps([{"type": "stdin_stdout", "input": "hi\n", "output": "hi\n"}]),
             "metadata": "{}"}]

    def load_dataset(hub_id, name=None, split=None, cache_dir=None):
        calls.append((hub_id, name, split))
        if hub_id == "missing/dataset":
            raise FileNotFoundError("no such dataset")
        return FakeHubDataset(rows)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr(deepcoder, "_CACHE", SourceCache())  # an empty cache: the hub is loaded here
    env = envs.make("deepcoder", source="hub", hub_config="taco", split="test")
    assert calls == [("agentica-org/DeepCoder-Preview-Dataset", "taco", "test")]
    assert env.hide_paths == ("/nonexistent/cache/data-00000.arrow",)
    env.reset(seed=0)
    assert answer(env, "print(input())")[1] == 1.0
    with pytest.raises(CodeDatasetError, match="source='builtin'"):
        envs.make("deepcoder", source="hub", hub_id="missing/dataset")


# --- the env contract (tests/envs/test_all_envs.py runs it once deepcoder is a built-in) ------------

@pytest.mark.skipif("envs.deepcoder" in BUILTIN_MODULES, reason="tests/envs/test_all_envs.py runs the checker")
def test_env_passes_the_checker_and_survives_hostile_text():
    envs.check_env(lambda: envs.make("deepcoder"))
    env = envs.make("deepcoder")
    rng = np.random.default_rng(0)
    pieces = ["<think>", "</think>", "<answer>", "</answer>", "||", "```", "\x00", "\udcff", "import os", "\n"]
    for seed in range(20):
        env.reset(seed=seed)
        text = "".join(pieces[int(i)] for i in rng.integers(len(pieces), size=12))
        _, reward, _, _, info = env.step(text)
        assert np.isfinite(reward) and (info["action_is_valid"] or reward == -0.1)
    assert isinstance(DeepCoderEnv(DeepCoderConfig()).instruction, str)


# --- reward hacking: no program can obtain a problem's expected output ----------------------------

HACK = '''
import json, os, sys
MARK = {mark!r}[::-1]  # reversed, so that the program does not find itself
def lookup():
    """Every readable file of the filesystem, searched for the problem's row."""
    scanned = 0
    for top, dirs, files in os.walk(os.environ.get('HACK_ROOT', '/')):  # the sandbox clears the environment
        if top.startswith('/proc'):
            dirs[:] = []
            continue
        for name in files:
            path = os.path.join(top, name)
            try:
                if not os.path.isfile(path) or os.path.getsize(path) > 8 * 2**20:  # not /dev/zero
                    continue
                data = open(path, 'rb').read()
            except OSError:
                continue
            scanned += 1
            if MARK.encode() in data:
                sys.stderr.write('FOUND ' + path + chr(10))
                for line in data.decode('utf-8', 'replace').splitlines():
                    if MARK in line:
                        return json.loads(line)
    sys.stderr.write('scanned %d files, found nothing' % scanned + chr(10))
    return None
def answer(args):
    row = lookup() or {{'tests': []}}
    tests = row['tests'] if isinstance(row['tests'], list) else json.loads(row['tests'])
    for test in tests:
        if test['input'] == args:
            return test['output']
'''


def hack_for(problem) -> str:
    """A "solution" that reads the expected outputs from wherever the data lies."""
    mark = "".join(ch for ch in problem.statement[:40] if ch.isalnum() or ch == " ").strip()[:30]
    code = HACK.format(mark=mark[::-1])
    call = next((test for test in problem.tests if test.kind == "call"), None)
    if call is None:
        return code + "out = answer(sys.stdin.read())\nprint(out if out is not None else '', end='')\n"
    return code + (f"def {call.fn_name}(*args):\n    out = answer(list(args))\n"
                   "    return out[0] if isinstance(out, list) and len(out) == 1 else out\n"
                   "class Solution:\n" f"    def {call.fn_name}(self, *args):\n        return {call.fn_name}(*args)\n")


def test_no_program_can_read_the_expected_outputs(monkeypatch):
    """The issue's hack scored 1.0 on 31 of 31 problems through env.step; here it scores 0 on
    every one, and it did search: it scanned the files the sandbox shows and found no row."""
    env = envs.make("deepcoder")
    # Outside the sandbox the hack works, so a 0 inside means the data was out of its reach.
    stdio_problem = next(p for p in env.problems if all(t.kind == "stdio" for t in p.tests))
    test = stdio_problem.tests[0]
    bare = subprocess.run([sys.executable, "-I", "-S", "-c", hack_for(stdio_problem)], input=test.input, text=True,
                          capture_output=True, timeout=300, env={"HACK_ROOT": str(deepcoder.DATA_DIR.parent)})
    assert bare.stdout.strip() == test.expected.strip() and "FOUND" in bare.stderr
    monkeypatch.setattr(sandbox, "_SLOTS", threading.BoundedSemaphore(4))
    rewards = {}
    for problem in env.problems:
        reset_to(env, problem.problem_id)
        _, reward, _, _, info = answer(env, hack_for(problem))
        rewards[problem.problem_id] = reward
    assert len(rewards) == 31 and set(rewards.values()) == {0.0}, rewards
    probe = sandbox.run_python(hack_for(stdio_problem), test.input, hide_paths=env.hide_paths)
    assert "scanned" in probe.stderr and "FOUND" not in probe.stderr, probe.stderr[-500:]
