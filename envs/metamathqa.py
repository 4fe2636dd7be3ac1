"""MetaMathQA: answer a math word problem; the label is the text after "The answer is: ".

Data sources (config `source`):
- `builtin` (default): 200 GSM8K test problems shipped in envs/data/ in MetaMathQA's schema
  (MIT; see envs/data/README.md), so the env works with no network.
- `file`: a local JSON (a list of rows, like MetaMathQA-395K.json) or JSONL file (a row
  per line) with fields `query` and `response` (`type` and `original_question` optional).
- `hub`: `datasets.load_dataset(hub_id, split=split)`, imported only when used.

Loaded data is cached per (source, split) behind a lock, so the P×G env copies of a
rollout share one table and threads never load it twice.

Scoring (config `scoring`, see envs/math_answers.py): `strict` is RAGEN's (lower-case,
no whitespace, exact match); `math` compares numbers as numbers. Reward 1 for a correct
answer, else 0; success = correct. With max_actions_per_traj > 1 it follows RAGEN's
multi-turn rule: attempt k (0-based) earns 1/2**k, a wrong answer is answered with
"Incorrect. Please think again." and the episode continues until the budget runs out
(truncation, as in RAGEN; only a correct answer terminates).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from envs.base import ActionOutcome, EnvConfig, EnvConfigError, TextEnv
from envs.data_files import HubRows, SourceCache, file_version, load_hub_dataset, read_utf8
from envs.math_answers import ANSWER_MARKER, SCORING_MODES, answers_match, extract_label
from envs import ragen_text
from envs.registry import register

BUILTIN_PATH = Path(__file__).resolve().parent / "data" / "gsm8k_test_metamathqa.jsonl"
SOURCES = ("builtin", "file", "hub")
CORRECT_FEEDBACK = "Correct!"
INCORRECT_FEEDBACK = "Incorrect. Please think again."


class MathDatasetError(ValueError):
    """A math dataset that cannot be loaded or has a bad row; the message names where."""


@dataclass(frozen=True)
class MathProblem:
    query: str
    label: str
    type: str = ""


def problem_from_row(row, where: str) -> MathProblem:
    """Validate one MetaMathQA-schema row; `where` names it in errors ("file.jsonl: row 3")."""
    if not isinstance(row, dict):
        raise MathDatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for field in ("query", "response"):
        if field not in row:
            raise MathDatasetError(f"{where}: missing field '{field}' (rows need 'query' and 'response')")
        if not isinstance(row[field], str):
            raise MathDatasetError(f"{where}: field '{field}' must be a string, got {type(row[field]).__name__}")
    if not row["query"].strip():
        raise MathDatasetError(f"{where}: 'query' is empty")
    label = extract_label(row["response"])
    if label is None:
        raise MathDatasetError(f"{where}: 'response' has no final answer after '{ANSWER_MARKER}'")
    row_type = row.get("type") or ""
    if not isinstance(row_type, str):
        raise MathDatasetError(f"{where}: field 'type' must be a string, got {type(row_type).__name__}")
    return MathProblem(query=row["query"], label=label, type=row_type)


def read_problem_file(path: Path) -> tuple[MathProblem, ...]:
    """Read a JSON array or JSONL file of MetaMathQA rows, validating every row."""
    text = read_utf8(path, MathDatasetError)
    problems: list[MathProblem] = []
    # One JSON array (as MetaMathQA-395K.json is shipped) or JSONL; a .jsonl file is never
    # sniffed, since its first row could itself be an array (a bad row to report as such).
    if path.suffix != ".jsonl" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as error:
            raise MathDatasetError(f"{path}: not valid JSON ({error})") from None
        for number, row in enumerate(rows, start=1):
            problems.append(problem_from_row(row, f"{path}: row {number}"))
    else:  # JSONL: one row per non-blank line
        for line_number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{path}: row {len(problems) + 1} (line {line_number})"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise MathDatasetError(f"{where}: not valid JSON ({error.msg})") from None
            problems.append(problem_from_row(row, where))
    if not problems:
        raise MathDatasetError(f"{path}: holds no rows")
    return tuple(problems)


def load_hub_problems(hub_id: str, split: str, cache_dir: str) -> HubRows:
    name = f"hub dataset '{hub_id}' split '{split}'"
    dataset = load_hub_dataset(hub_id, None, split, cache_dir, name=name, error=MathDatasetError, offline_hint=(
        "Without the Hugging Face hub, use source='builtin' (the shipped GSM8K sample) or source='file' with "
        "path= a local JSON/JSONL file"))
    missing = [column for column in ("query", "response") if column not in dataset.column_names]
    if missing:
        raise MathDatasetError(f"{name}: missing column(s) {missing}; columns are {dataset.column_names}")
    if len(dataset) == 0:
        raise MathDatasetError(f"{name}: holds no rows")
    return HubRows(dataset, name, problem_from_row)


_CACHE = SourceCache()


def _cache_key(config: MetaMathQAConfig) -> tuple:
    if config.source == "hub":
        return ("hub", config.hub_id, config.split, config.cache_dir)
    path = BUILTIN_PATH if config.source == "builtin" else Path(config.path).expanduser().resolve()
    return ("file", str(path), file_version(path))


def load_problems(config: MetaMathQAConfig) -> Sequence[MathProblem]:
    """The problems `config` names, loaded once per (source, split) and shared."""
    key = _cache_key(config)
    if config.source == "hub":
        return _CACHE.get(key, lambda: load_hub_problems(config.hub_id, config.split, config.cache_dir))
    return _CACHE.get(key, lambda: read_problem_file(Path(key[1])))


@dataclass(frozen=True)
class MetaMathQAConfig(EnvConfig):
    max_actions_per_traj: int = 1
    source: str = "builtin"  # builtin | file | hub
    path: str = ""  # the JSON/JSONL file, for source='file'
    hub_id: str = "meta-math/MetaMathQA"
    split: str = "train"  # the hub split; a file is one split
    cache_dir: str = ""  # for datasets.load_dataset; "" = its default
    scoring: str = "strict"  # strict (RAGEN) | math

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise EnvConfigError(f"source must be one of {list(SOURCES)}, got {self.source!r}")
        if self.source == "file" and not self.path:
            raise EnvConfigError("source='file' needs path= a JSON or JSONL file in MetaMathQA's schema")
        if self.source != "file" and self.path:
            raise EnvConfigError(f"path is only read with source='file' (source is {self.source!r})")
        if self.source == "hub" and not (self.hub_id and self.split):
            raise EnvConfigError("source='hub' needs a non-empty hub_id and split")
        if self.scoring not in SCORING_MODES:
            raise EnvConfigError(f"scoring must be one of {list(SCORING_MODES)}, got {self.scoring!r}")
        super().__post_init__()


class MetaMathQAEnv(TextEnv):
    config_cls = MetaMathQAConfig

    def __init__(self, config: MetaMathQAConfig | None = None):
        super().__init__(config)
        self.problems = load_problems(self.config)  # at construction, so a bad source fails early
        self.problem: MathProblem | None = None
        self.index = -1
        self.attempts = 0
        self.feedback: str | None = None

    @property
    def ragen_instruction(self) -> str:
        return ragen_text.METAMATHQA

    @property
    def instruction(self) -> str:
        return "You are solving math problems. Put only the final answer in the answer tags, e.g. <answer>18</answer>."

    def _reset(self, rng: np.random.Generator) -> dict:
        self.index = int(rng.integers(len(self.problems)))
        self.problem = self.problems[self.index]
        self.attempts = 0
        self.feedback = None
        return {"index": self.index, "type": self.problem.type}

    def _apply_action(self, action: str) -> ActionOutcome:
        correct = answers_match(action, self.problem.label, self.config.scoring)
        reward = 1.0 / 2 ** self.attempts if correct else 0.0
        info = {"correct": correct, "attempt": self.attempts, "label": self.problem.label}
        self.attempts += 1
        self.feedback = CORRECT_FEEDBACK if correct else INCORRECT_FEEDBACK
        return ActionOutcome(reward, terminated=correct, success=correct, info=info)

    def render(self) -> str:
        if self.problem is None:
            return "(no problem yet: call reset)"
        return self.feedback if self.feedback is not None else self.problem.query

    def sample_action(self, rng: np.random.Generator) -> str:
        """A number string; about a quarter of the time the right answer."""
        label = self.problem.label if self.problem is not None else ""
        if rng.random() < 0.25 and label.strip() and "||" not in label and "</answer>" not in label:
            return label
        return str(int(rng.integers(0, 1000)))


register("metamathqa", MetaMathQAEnv, MetaMathQAConfig(),
         "MetaMathQA-style math word problems, RAGEN's strict answer match (offline: 200 GSM8K test rows)",
         aliases=("metamath",))
register("metamathqa_math", MetaMathQAEnv, MetaMathQAConfig(scoring="math"),
         "MetaMathQA-style math word problems, answers compared as numbers (1,500 = 1500, 0.5 = 1/2)")
