"""DeepCoder: write a Python program for a problem statement; its tests run in the sandbox.

The observation is the problem; the answer is a program inside <answer> (a ```python fence
inside the tags is fine: the last fenced block is taken). Each test runs in its own
sandboxed process (envs/sandbox/: namespaces, an allow-listed read-only root, seccomp,
resource and memory limits, no network); reward = fraction of tests passed, success = all passed. RAGEN's semantics: a
single turn by default; with max_actions_per_traj > 1 a failed program is answered with
feedback and may be retried (only all-pass terminates). The feedback names the verdict, how
many tests passed and which failed first, never a hidden test's input or expected output nor
anything the program wrote (envs/deepcoder_judge.py says why; `feedback="verbose"` is the old,
farmable "expected X, got Y").

Two kinds of test (DeepCoder's, TACO's and LiveCodeBench's layouts are all read):
- stdin/stdout: the program reads the input; its output passes when, with both sides
  stripped and every line's whitespace runs collapsed, the lines are equal;
- function call: the program defines `fn_name` (or `class Solution` with that method);
  it is called with the JSON arguments, and the result must be JSON-equal to the
  expected value (bool is not a number). DeepCoder/TACO rows store the return value in a
  one-element list (so do ours); LiveCodeBench rows store it as JSON text.

Data (config `source`): `builtin` (31 problems we wrote, each with a reference solution,
envs/data/deepcoder_builtin.jsonl), `file` (JSON array or JSONL of such rows), `hub`
(`datasets.load_dataset(hub_id, hub_config, split=split)`, e.g. agentica-org/
DeepCoder-Preview-Dataset with primeintellect | taco | lcbv5 | codeforces). The sandbox's
filesystem holds only the interpreter and its standard library, so the data (and any copy
of it: a checkout, site-packages, a hub cache) is absent: no program can read the expected
outputs (tests/envs/test_deepcoder.py tries). Its paths are also passed as `hide_paths`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from envs.base import ActionOutcome, EnvConfig, EnvConfigError, TextEnv
from envs.data_files import HubRows, SourceCache, file_version, load_hub_dataset, read_utf8
from envs.deepcoder_judge import (CALL_HARNESS, FEEDBACK_MODES, CodeTest, TestOutcome, feedback_text, judge,
                                  json_equal)
from envs.parsing import ParsedResponse, parse_response
from envs import ragen_text
from envs.registry import register
from envs.sandbox import SandboxLimits, run_python

DATA_DIR = Path(__file__).resolve().parent / "data"
BUILTIN_PATH = DATA_DIR / "deepcoder_builtin.jsonl"
SOURCES = ("builtin", "file", "hub")
# Possessive header runs: with plain `*` a fence then a long blank run ending in anything but a
# newline backtracked over every split of the run between the two `[ \t]*` (quadratic: 64,000
# blanks took 12 s). The classes are disjoint from each other and from `\n`, so no match changes.
_FENCE = re.compile(r"```[ \t]*+[A-Za-z0-9_+-]*+[ \t]*+\n(.*?)(?:```|\Z)", re.DOTALL)
__all__ = ["CALL_HARNESS", "CodeDatasetError", "CodeProblem", "CodeTest", "DeepCoderConfig", "DeepCoderEnv",
           "TestOutcome", "extract_code", "json_equal", "parse_tests", "run_test", "run_tests"]


class CodeDatasetError(ValueError):
    """A code dataset that cannot be loaded, or a row that is malformed; the message says where."""


@dataclass(frozen=True)
class CodeProblem:
    problem_id: str
    statement: str
    tests: tuple[CodeTest, ...]
    solution: str = ""  # a reference solution, where the data has one
    starter_code: str = ""


# --- reading DeepCoder / TACO / LiveCodeBench test layouts --------------------------------

def _as_json(value, where: str, what: str):
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as error:
        raise CodeDatasetError(f"{where}: {what} is not valid JSON ({error.msg})") from None


def _text(value, where: str) -> str:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)  # TACO sometimes stores the lines as a list
    if not isinstance(value, str):
        raise CodeDatasetError(f"{where}: stdin/stdout tests need text, got {type(value).__name__}")
    return value


def _call_test(item: dict, fn_name, where: str) -> CodeTest:
    if not isinstance(fn_name, str) or not fn_name.isidentifier():
        raise CodeDatasetError(f"{where}: a function-call test needs fn_name (a Python name), got {fn_name!r}")
    raw_input, expected = item.get("input"), item.get("output")
    if isinstance(raw_input, str):  # LiveCodeBench: one JSON value per line, one per argument
        args = [_as_json(line, where, "an argument line") for line in raw_input.splitlines() if line.strip()]
        return CodeTest("call", args, _as_json(expected, where, "the expected output"), fn_name)
    args = list(raw_input) if isinstance(raw_input, (list, tuple)) else [raw_input]
    wrapped = isinstance(expected, list) and len(expected) == 1
    return CodeTest("call", args, expected, fn_name, wrapped)


def parse_tests(raw, metadata, where: str) -> tuple[CodeTest, ...]:
    """A row's tests, from DeepCoder's list, TACO's {inputs, outputs, fn_name} or LCB's list."""
    raw = _as_json(raw, where, "'tests'")
    metadata = _as_json(metadata or {}, where, "'metadata'")
    default_fn = metadata.get("func_name") if isinstance(metadata, dict) else None
    if isinstance(raw, dict) and "inputs" in raw and "outputs" in raw:  # TACO
        if not (isinstance(raw["inputs"], list) and isinstance(raw["outputs"], list)):
            raise CodeDatasetError(f"{where}: 'inputs' and 'outputs' must be lists")
        if len(raw["inputs"]) != len(raw["outputs"]):
            raise CodeDatasetError(f"{where}: {len(raw['inputs'])} inputs but {len(raw['outputs'])} outputs")
        kind = "function_call" if raw.get("fn_name") else "stdin_stdout"
        raw = [{"type": kind, "fn_name": raw.get("fn_name"), "input": i, "output": o}
               for i, o in zip(raw["inputs"], raw["outputs"])]
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise CodeDatasetError(f"{where}: 'tests' must be a non-empty list of tests, got {type(raw).__name__}")
    tests = []
    for number, item in enumerate(raw, start=1):
        here = f"{where}: test {number}"
        if not isinstance(item, dict) or "input" not in item or "output" not in item:
            raise CodeDatasetError(f"{here}: expected an object with 'input' and 'output'")
        kind = item.get("type") or item.get("testtype") or "stdin_stdout"
        if kind in ("function_call", "functional"):
            item_meta = _as_json(item.get("metadata") or {}, here, "'metadata'")
            fn_name = item.get("fn_name") or (item_meta.get("func_name") if isinstance(item_meta, dict) else None)
            tests.append(_call_test(item, fn_name or default_fn, here))
        elif kind in ("stdin_stdout", "stdin", "stdio"):
            tests.append(CodeTest("stdio", _text(item["input"], here), _text(item["output"], here)))
        else:
            raise CodeDatasetError(f"{here}: unknown test type {kind!r} (stdin_stdout or function_call)")
    return tuple(tests)


def problem_from_row(row, where: str) -> CodeProblem:
    if not isinstance(row, dict):
        raise CodeDatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
    statement = row.get("problem") or row.get("question") or row.get("prompt")
    if not isinstance(statement, str) or not statement.strip():
        raise CodeDatasetError(f"{where}: needs a non-empty 'problem' (or 'question') text")
    if "tests" not in row and "ground_truth" not in row:
        raise CodeDatasetError(f"{where}: missing 'tests'")
    tests = parse_tests(row.get("tests", row.get("ground_truth")), row.get("metadata"), where)
    solution, starter = row.get("solution") or "", row.get("starter_code") or ""
    if not isinstance(solution, str) or not isinstance(starter, str):
        raise CodeDatasetError(f"{where}: 'solution' and 'starter_code' must be strings")
    return CodeProblem(str(row.get("id", where)), statement, tests, solution, starter)


def read_problem_file(path: Path) -> tuple[CodeProblem, ...]:
    text = read_utf8(path, CodeDatasetError)
    if path.suffix != ".jsonl" and text.lstrip().startswith("["):
        rows = _as_json(text, str(path), "the file")
        problems = [problem_from_row(row, f"{path}: row {n}") for n, row in enumerate(rows, start=1)]
    else:
        problems = []
        for line_number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                where = f"{path}: row {len(problems) + 1} (line {line_number})"
                problems.append(problem_from_row(_as_json(line, where, "the row"), where))
    if not problems:
        raise CodeDatasetError(f"{path}: holds no rows")
    return tuple(problems)


def load_hub_problems(config: DeepCoderConfig) -> HubRows:
    """A hub dataset converted row by row (LiveCodeBench rows carry megabytes of tests)."""
    name = f"hub dataset '{config.hub_id}' ({config.hub_config or 'default'}) split '{config.split}'"
    dataset = load_hub_dataset(config.hub_id, config.hub_config, config.split, config.cache_dir, name=name,
                               error=CodeDatasetError, offline_hint="Offline, use source='builtin' or "
                               "source='file' with path= a JSON/JSONL file")
    if "tests" not in dataset.column_names or len(dataset) == 0:
        raise CodeDatasetError(f"{name}: needs rows with a 'tests' column; columns are {dataset.column_names}")
    return HubRows(dataset, name, problem_from_row)


def data_paths(config: DeepCoderConfig, problems: Sequence[CodeProblem]) -> tuple[str, ...]:
    """Where the expected outputs lie on disk: the sandbox hides these from the programs."""
    if config.source == "builtin":
        return (str(DATA_DIR),)
    if config.source == "file":
        return (str(Path(config.path).expanduser().resolve()),)
    files = [entry["filename"] for entry in getattr(getattr(problems, "dataset", None), "cache_files", None) or []]
    return tuple(files) + ((str(Path(config.cache_dir).expanduser().resolve()),) if config.cache_dir else ())


_CACHE = SourceCache()


def load_problems(config: DeepCoderConfig) -> Sequence[CodeProblem]:
    """The problems `config` names, loaded once per source and shared by every env copy."""
    if config.source == "hub":
        key = ("hub", config.hub_id, config.hub_config, config.split, config.cache_dir)
        return _CACHE.get(key, lambda: load_hub_problems(config))
    path = BUILTIN_PATH if config.source == "builtin" else Path(config.path).expanduser().resolve()
    return _CACHE.get(("file", str(path), file_version(path)), lambda: read_problem_file(path))


# --- running and judging -----------------------------------------------------------------

def dedent(text: str) -> str:
    """textwrap.dedent(text), in one pass: textwrap compiles the common margin into a regex, which
    for a 648,000-blank margin costs 0.4 s of the host's CPU."""
    lines = ["" if not line.strip(" \t") else line for line in text.split("\n")]  # blank lines → ""
    indents = [line[:len(line) - len(line.lstrip(" \t"))] for line in lines if line]
    margin = os.path.commonprefix(indents) if indents else ""
    if not margin:
        return "\n".join(lines)
    return "\n".join(line[len(margin):] if line else line for line in lines)


def extract_code(answer: str) -> str:
    """The program in an answer: the last ``` fenced block if there is one, else all of it."""
    blocks = _FENCE.findall(answer)
    code = blocks[-1] if blocks else answer
    return dedent(code).strip("\n")


def run_test(code: str, test: CodeTest, limits: SandboxLimits, hide_paths: tuple[str, ...] = ()) -> TestOutcome:
    """Run one test of `code` in the sandbox and judge it (never raises: both halves return verdicts)."""
    if test.kind == "call":
        request = json.dumps({"fn_name": test.fn_name, "args": test.input})
        result = run_python(CALL_HARNESS, request, limits, files={"solution.py": code}, hide_paths=hide_paths)
    else:
        result = run_python(code, test.input, limits, hide_paths=hide_paths)
    return dataclasses.replace(judge(test, result), host_cpu_seconds=result.host_cpu_seconds)


def run_tests(code: str, tests: Sequence[CodeTest], limits: SandboxLimits, *, parallel: int = 4,
              hide_paths: tuple[str, ...] = ()) -> list[TestOutcome]:
    """Every test of `code`, up to `parallel` at once (each its own sandbox), in order."""
    if parallel <= 1 or len(tests) <= 1:
        return [run_test(code, test, limits, hide_paths) for test in tests]
    with ThreadPoolExecutor(max_workers=min(parallel, len(tests))) as pool:
        return list(pool.map(lambda test: run_test(code, test, limits, hide_paths), tests))


# --- the env -------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeepCoderConfig(EnvConfig):
    max_actions_per_traj: int = 1
    source: str = "builtin"  # builtin | file | hub
    path: str = ""  # for source='file'
    hub_id: str = "agentica-org/DeepCoder-Preview-Dataset"
    hub_config: str = "primeintellect"  # the hub dataset's config (subset); "" for none
    split: str = "train"
    cache_dir: str = ""
    cpu_seconds: int = 2  # per test
    wall_seconds: float = 6.0  # per test
    memory_mb: int = 256  # per test (address space)
    max_tests: int = 0  # run at most this many tests of a problem (the first ones); 0 = all
    parallel_tests: int = 4  # tests of one program run at once (each in its own sandbox)
    feedback: str = "verdict"  # verdict | verbose (shows hidden tests' expected outputs: farmable)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise EnvConfigError(f"source must be one of {list(SOURCES)}, got {self.source!r}")
        if self.feedback not in FEEDBACK_MODES:
            raise EnvConfigError(f"feedback must be one of {list(FEEDBACK_MODES)}, got {self.feedback!r}")
        if (self.source == "file") != bool(self.path):
            raise EnvConfigError("path= is needed with source='file' and read only then")
        if self.source == "hub" and not (self.hub_id and self.split):
            raise EnvConfigError("source='hub' needs a non-empty hub_id and split")
        if self.max_actions_per_turn != 1:
            raise EnvConfigError(f"deepcoder takes one program per turn: max_actions_per_turn must be 1, "
                                 f"got {self.max_actions_per_turn}")
        for name, low in (("max_tests", 0), ("parallel_tests", 1)):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < low:
                raise EnvConfigError(f"{name} must be an int >= {low}, got {getattr(self, name)!r}")
        try:
            self.limits()
        except (TypeError, ValueError) as error:
            raise EnvConfigError(f"bad sandbox limits: {error}") from None
        super().__post_init__()

    def limits(self) -> SandboxLimits:
        return SandboxLimits(cpu_seconds=self.cpu_seconds, wall_seconds=self.wall_seconds,
                             memory_bytes=self.memory_mb * 2**20)


class DeepCoderEnv(TextEnv):
    config_cls = DeepCoderConfig

    def __init__(self, config: DeepCoderConfig | None = None):
        super().__init__(config)
        self.problems = load_problems(self.config)
        self.limits = self.config.limits()
        self.hide_paths = data_paths(self.config, self.problems)
        self.problem: CodeProblem | None = None
        self.index = -1
        self.feedback: str | None = None

    @property
    def ragen_instruction(self) -> str:
        return ragen_text.DEEPCODER

    @property
    def ragen_max_words(self) -> int:
        return ragen_text.DEEPCODER_MAX_TOKENS

    @property
    def instruction(self) -> str:
        return ("You are solving programming problems. Write a complete Python 3 program (standard library "
                "only) and put it inside the answer tags; a ```python code fence inside them is fine. Unless "
                "the problem asks for a function, read the input from stdin and print the answer.")

    def parse(self, response: str) -> ParsedResponse:
        """The whole answer is one program: code may contain `||`, so nothing is split."""
        parsed = parse_response(response, vocabulary=None, max_actions=1, require_think=self.config.require_think)
        if not parsed.format_ok:
            return parsed
        program = parsed.answer.strip()
        return dataclasses.replace(parsed, actions=(program,) if program else (), dropped=(), num_dropped=0,
                                   error=None if program else "empty answer")

    @property
    def tests(self) -> tuple[CodeTest, ...]:
        tests = self.problem.tests
        return tests[: self.config.max_tests] if self.config.max_tests else tests

    def _reset(self, rng: np.random.Generator) -> dict:
        self.index = int(rng.integers(len(self.problems)))
        self.problem = self.problems[self.index]
        self.feedback = None
        return {"index": self.index, "problem_id": self.problem.problem_id, "num_tests": len(self.tests)}

    def _apply_action(self, action: str) -> ActionOutcome:
        tests, code = self.tests, extract_code(action)
        outcomes = run_tests(code, tests, self.limits, parallel=self.config.parallel_tests, hide_paths=self.hide_paths)
        passed = sum(outcome.passed for outcome in outcomes)
        success = passed == len(tests)
        failure = next(((n, o) for n, o in enumerate(outcomes, start=1) if not o.passed), None)
        self.feedback = feedback_text(outcomes, tests, self.problem.statement, code, self.config.feedback)
        # info is the host's (logs, tests), never the policy's: it keeps the judge's full message.
        info = {"passed": passed, "total": len(tests), "verdicts": [o.verdict for o in outcomes],
                "first_failure": None if failure is None else f"test {failure[0]}: {failure[1].message}",
                # the host CPU the sandbox runs cost (check_env and the benchmark tell it from ours)
                "sandbox_host_cpu_seconds": sum(o.host_cpu_seconds for o in outcomes)}
        return ActionOutcome(passed / len(tests), terminated=success, success=success, info=info)

    def render(self) -> str:
        if self.problem is None:
            return "(no problem yet: call reset)"
        if self.feedback is not None:
            return self.feedback
        text = self.problem.statement.strip()
        calls = sorted({test.fn_name for test in self.tests if test.kind == "call"})
        if calls:
            text += (f"\n\nThe tests call {calls[0]} (a function, or a method of class Solution) with their "
                     "arguments and check what it returns.")
        if self.problem.starter_code.strip():
            text += f"\n\nStarter code:\n```python\n{self.problem.starter_code.strip()}\n```"
        return text

    def sample_action(self, rng: np.random.Generator) -> str:
        """A small program: the reference solution a third of the time, else a plausible wrong one."""
        problem = self.problem
        if problem is not None and problem.solution.strip() and rng.random() < 1 / 3:
            return problem.solution.strip()
        calls = sorted({test.fn_name for test in problem.tests if test.kind == "call"}) if problem else []
        if calls:
            value = int(rng.integers(0, 10))
            return f"def {calls[0]}(*args):\n    return {value}"
        return ["print(input())", "import sys\nprint(len(sys.stdin.read().split()))", "print(0)"][int(rng.integers(3))]


register("deepcoder", DeepCoderEnv, DeepCoderConfig(),
         "DeepCoder-style code generation: a Python program per problem, tests run in a sandbox "
         "(offline: 31 problems with tests; hub: agentica-org/DeepCoder-Preview-Dataset)",
         aliases=("deep_coder",))
