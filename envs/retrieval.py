"""Retrieval for search-style envs: a `Retriever` protocol and a BM25 implementation.

    retriever = BM25Retriever([Passage("Orlen Lighthouse", "The Orlen Lighthouse stands …"), …])
    retriever.search("who designed the orlen lighthouse", k=3)  # → up to 3 Passages, best first

Anything with `search(query, k) -> list[Passage]` is a `Retriever`, so a dense retriever
(an embedding index) can slot in later beside BM25: `RETRIEVER_KINDS` maps a config name
to a class built from a sequence of passages.

BM25 is bm25s's Lucene variant (k1=1.5, b=0.75, idf = ln(1 + (N - df + 0.5)/(df + 0.5))),
whose idf stays positive when a word is in most of the passages: Okapi's idf turns
negative there, and with ten look-alike paragraphs per question (the eight distractors
are chosen to resemble the gold two) that flattened the ranking. The tokenizer is ours:
lower-cased word characters minus a short stopword list, so "the" and "of" in a question
do not outweigh the names that identify a paragraph. Each passage is indexed as its title plus
its text. Passages with score 0 (no query word in them) are never returned, and ties keep
corpus order, so a search is deterministic.

A corpus file (JSONL, one `{"title": …, "text": …}` per line) is read and indexed once per
(path, mtime, size) behind a lock and shared by every env copy and thread.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from envs.data_files import SourceCache, file_version, json_lines, read_utf8

# Words so common in questions that matching them says nothing about the paragraph.
STOPWORDS = frozenset(
    "a an and are as at be by did do does for from had has have he her his in is it its of on or "
    "she that the their this to was were what when where which who whom whose why with how".split()
)
# A megabyte-long query is cut to its first words rather than tokenized and scored whole.
MAX_QUERY_CHARS, MAX_QUERY_TOKENS = 4000, 64
_WORD = re.compile(r"\w+")


class RetrievalError(ValueError):
    """A corpus that cannot be read or indexed; the message names the file and row."""


@dataclass(frozen=True)
class Passage:
    title: str
    text: str


@runtime_checkable
class Retriever(Protocol):
    def search(self, query: str, k: int) -> list[Passage]:
        """The at most `k` passages that best match `query`, best first."""


def tokenize(text: str) -> list[str]:
    return [word for word in _WORD.findall(text.lower()) if word not in STOPWORDS]


class BM25Retriever:
    """BM25 over a fixed list of passages (read-only after construction: thread-safe)."""

    def __init__(self, passages: Sequence[Passage], k1: float = 1.5, b: float = 0.75):
        try:
            import bm25s  # lazily: importing envs must not need it (and it takes ~1 s)
        except ImportError:
            raise RetrievalError("BM25 retrieval needs the 'bm25s' package (pip install bm25s)") from None
        self.passages = tuple(passages)
        if not self.passages:
            raise RetrievalError("cannot index an empty list of passages")
        documents = [tokenize(f"{p.title} {p.text}") for p in self.passages]
        self.index = None  # a corpus without a single word matches nothing
        if any(documents):
            self.index = bm25s.BM25(k1=k1, b=b, method="lucene")
            self.index.index(documents, show_progress=False)

    def __len__(self) -> int:
        return len(self.passages)

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every passage for `query`, in corpus order."""
        if self.index is None:
            return np.zeros(len(self.passages))
        tokens = tokenize(query[:MAX_QUERY_CHARS])[:MAX_QUERY_TOKENS]
        token_ids = self.index.get_tokens_ids(tokens)  # words outside the index drop out
        if not token_ids:
            return np.zeros(len(self.passages))
        return np.asarray(self.index.get_scores_from_ids(token_ids), dtype=float)

    def search(self, query: str, k: int) -> list[Passage]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        scores = self.scores(query)
        # Stable sort on -score: equal scores keep corpus order.
        order = np.argsort(-scores, kind="stable")[:k]
        return [self.passages[i] for i in order if scores[i] > 0]


# Config name → a class built from a sequence of passages (room for "dense" later).
RETRIEVER_KINDS: dict[str, type] = {"bm25": BM25Retriever}


def make_retriever(kind: str, passages: Sequence[Passage]) -> Retriever:
    if kind not in RETRIEVER_KINDS:
        raise RetrievalError(f"unknown retriever {kind!r}; known: {sorted(RETRIEVER_KINDS)}")
    return RETRIEVER_KINDS[kind](passages)


def passage_from_row(row, where: str) -> Passage:
    if not isinstance(row, dict):
        raise RetrievalError(f"{where}: expected a JSON object with 'title' and 'text', got {type(row).__name__}")
    for field in ("title", "text"):
        if field not in row:
            raise RetrievalError(f"{where}: missing field '{field}' (rows need 'title' and 'text')")
        if not isinstance(row[field], str):
            raise RetrievalError(f"{where}: field '{field}' must be a string, got {type(row[field]).__name__}")
    if not (row["title"].strip() or row["text"].strip()):
        raise RetrievalError(f"{where}: both 'title' and 'text' are empty")
    return Passage(title=row["title"].strip(), text=row["text"].strip())


def read_corpus_file(path: str | Path) -> tuple[Passage, ...]:
    """Read a JSONL corpus (one {"title", "text"} object per non-blank line)."""
    path = Path(path)
    text = read_utf8(path, RetrievalError, missing="no such corpus file")
    passages = [passage_from_row(row, where) for where, row in json_lines(text, path, RetrievalError)]
    if not passages:
        raise RetrievalError(f"{path}: holds no passages")
    return tuple(passages)


_CORPUS_CACHE = SourceCache()


def corpus_retriever(path: str | Path, kind: str = "bm25") -> Retriever:
    """The retriever over a corpus file, built once per (kind, path, mtime, size) and shared: an
    edited file is indexed again, and two threads never index the same file twice."""
    resolved = Path(path).expanduser().resolve()
    return _CORPUS_CACHE.get((kind, str(resolved), file_version(resolved)),
                             lambda: make_retriever(kind, read_corpus_file(resolved)))
