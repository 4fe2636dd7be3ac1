"""What the data-driven envs (MetaMathQA, DeepCoder, SearchQA and its corpus, WebShop) share to load
their data: a file read as UTF-8 with a clear error, a Hugging Face dataset loaded with a
clear error and converted row by row, and a cache that loads each source once for every env
copy (an edited file is read again). Each env keeps its own row schema and messages."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def read_utf8(path: Path, error: type[Exception], missing: str = "no such file") -> str:
    """The file's text; a missing or unreadable file raises `error` naming the path."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: {missing}") from None
    except (OSError, UnicodeDecodeError) as problem:
        raise error(f"{path}: cannot read it as UTF-8 text ({problem})") from None


def json_lines(text: str, path: Path, error: type[Exception]) -> Iterator[tuple[str, Any]]:
    """(where, row) for each non-blank line of a JSONL text, `where` = "PATH: line N"; a line that
    is not JSON raises `error` naming it."""
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}: line {line_number}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as problem:
            raise error(f"{where}: not valid JSON ({problem.msg})") from None


def file_version(path: Path) -> tuple[int, int] | None:
    """(mtime_ns, size): a cache key part that changes when the file is edited; None when it
    cannot be read (the reader then reports why)."""
    try:
        stat = Path(path).stat()
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size)


class SourceCache:
    """Loaded data by source key. The lock is held while loading, so two threads never load
    the same data twice."""

    def __init__(self):
        self._loaded: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple, load: Callable[[], T]) -> T:
        with self._lock:
            if key not in self._loaded:
                self._loaded[key] = load()
            return self._loaded[key]


def load_hub_dataset(hub_id: str, hub_config: str | None, split: str, cache_dir: str, *, name: str,
                     error: type[Exception], offline_hint: str):
    """`datasets.load_dataset`, imported only here; any failure raises `error` naming the dataset
    (`name`) and saying what to use without the hub (`offline_hint`)."""
    try:
        import datasets  # lazily: only the hub source needs it
    except ImportError:
        raise error(f"{name}: source='hub' needs the 'datasets' package (pip install datasets)") from None
    try:
        configs = [hub_config] if hub_config else []  # a dataset without configs is called with none
        return datasets.load_dataset(hub_id, *configs, split=split, cache_dir=cache_dir or None)
    except Exception as problem:  # offline, unknown id, bad split: datasets raises many types
        raise error(f"could not load {name} ({type(problem).__name__}: {problem}). {offline_hint}") from problem


class HubRows(Sequence):
    """A hub dataset converted row by row when read (hundreds of thousands of rows, or rows of
    megabytes, are not converted up front); `convert(row, where)` validates one row."""

    def __init__(self, dataset, name: str, convert: Callable[[Any, str], T]):
        self.dataset, self.name, self.convert = dataset, name, convert

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> T:
        return self.convert(self.dataset[int(index)], f"{self.name}: row {int(index)}")
