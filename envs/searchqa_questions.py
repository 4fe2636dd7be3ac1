"""SearchQA's questions: rows in HotpotQA's schema, validated, from the shipped offline set, a
JSONL/JSON file or the Hugging Face hub (`datasets.load_dataset`, imported only when used).
The env (envs/searchqa.py) picks the source and caches what is loaded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from envs.data_files import HubRows, json_lines, load_hub_dataset, read_utf8
from envs.retrieval import Passage

BUILTIN_PATH = Path(__file__).resolve().parent / "data" / "searchqa_offline.jsonl"


class QADatasetError(ValueError):
    """A question set that cannot be loaded or has a bad row; the message names where."""


@dataclass(frozen=True)
class MultiHopQuestion:
    id: str
    question: str
    answer: str
    type: str = ""
    level: str = ""
    supporting_facts: tuple[tuple[str, int], ...] = ()
    context: tuple[Passage, ...] = ()

    @property
    def supporting_titles(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(title for title, _ in self.supporting_facts))


def _pairs(value, keys: tuple[str, str], where: str) -> list[tuple]:
    """HotpotQA's (title, x) lists in any of their three spellings, as a list of pairs:
    `datasets` gives a dict of columns ({"title": [...], "sentences": [...]}), parquet
    exports a list of {"title", ...} objects, the original JSON a list of [title, x]."""
    first, second = keys
    if isinstance(value, dict):
        missing = [key for key in keys if key not in value]
        if missing:
            raise QADatasetError(f"{where}: missing key(s) {missing}")
        if not isinstance(value[first], list) or not isinstance(value[second], list):
            raise QADatasetError(f"{where}: '{first}' and '{second}' must be lists")
        if len(value[first]) != len(value[second]):
            raise QADatasetError(f"{where}: {len(value[first])} {first}s but {len(value[second])} {second}s")
        return list(zip(value[first], value[second]))
    if not isinstance(value, list):
        raise QADatasetError(f"{where}: expected a list or an object of lists, got {type(value).__name__}")
    pairs = []
    for number, item in enumerate(value):
        if isinstance(item, dict) and first in item and second in item:
            pairs.append((item[first], item[second]))
        elif isinstance(item, (list, tuple)) and len(item) == 2:
            pairs.append(tuple(item))
        else:
            raise QADatasetError(f"{where}[{number}]: expected [{first}, {second}] or an object with both keys")
    return pairs


def question_from_row(row, where: str) -> MultiHopQuestion:
    """Validate one HotpotQA-schema row; `where` names it in errors ("file.jsonl: line 3")."""
    if not isinstance(row, dict):
        raise QADatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for field in ("question", "answer"):
        if not isinstance(row.get(field), str) or not row[field].strip():
            raise QADatasetError(f"{where}: field '{field}' must be a non-empty string "
                                 f"(HotpotQA's fullwiki test split has no answers)")
    context = []
    for title, sentences in _pairs(row.get("context", []), ("title", "sentences"), f"{where}: context"):
        if not isinstance(title, str) or not isinstance(sentences, list) or \
                not all(isinstance(s, str) for s in sentences):
            raise QADatasetError(f"{where}: context entries need a string title and a list of string sentences")
        context.append(Passage(title.strip(), " ".join(s.strip() for s in sentences if s.strip())))
    facts = []
    for title, sent_id in _pairs(row.get("supporting_facts", []), ("title", "sent_id"), f"{where}: supporting_facts"):
        if not isinstance(title, str) or not isinstance(sent_id, int) or isinstance(sent_id, bool):
            raise QADatasetError(f"{where}: supporting_facts need a string title and an int sent_id")
        facts.append((title.strip(), sent_id))
    extras = {key: row.get(key) or "" for key in ("type", "level")}
    identifier = row.get("id", row.get("_id", ""))
    if not all(isinstance(v, str) for v in (*extras.values(), identifier)):
        raise QADatasetError(f"{where}: fields 'id', 'type' and 'level' must be strings")
    return MultiHopQuestion(identifier, row["question"].strip(), row["answer"].strip(), supporting_facts=tuple(facts),
                            context=tuple(context), **extras)


def read_question_file(path: Path) -> tuple[MultiHopQuestion, ...]:
    """Read a JSONL file of HotpotQA rows, or one JSON array of them (the original release)."""
    text = read_utf8(path, QADatasetError)
    if path.suffix != ".jsonl" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as error:
            raise QADatasetError(f"{path}: not valid JSON ({error})") from None
        questions = [question_from_row(row, f"{path}: row {n}") for n, row in enumerate(rows, start=1)]
    else:  # JSONL: one row per non-blank line
        questions = [question_from_row(row, where) for where, row in json_lines(text, path, QADatasetError)]
    if not questions:
        raise QADatasetError(f"{path}: holds no questions")
    return tuple(questions)


def load_hub_questions(hub_id: str, hub_config: str, split: str, cache_dir: str) -> HubRows:
    """A hub dataset converted row by row: 90k rows are not converted up front."""
    name = f"hub dataset '{hub_id}' config '{hub_config}' split '{split}'"
    dataset = load_hub_dataset(hub_id, hub_config, split, cache_dir, name=name, error=QADatasetError, offline_hint=(
        "Without the Hugging Face hub, use source='builtin' (the shipped offline set) or source='file' with "
        "path= a HotpotQA JSON/JSONL file"))
    missing = [column for column in ("question", "answer", "context") if column not in dataset.column_names]
    if missing:
        raise QADatasetError(f"{name}: missing column(s) {missing}; columns are {dataset.column_names}")
    if len(dataset) == 0:
        raise QADatasetError(f"{name}: holds no rows")
    return HubRows(dataset, name, question_from_row)
