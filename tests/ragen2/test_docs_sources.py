"""Numbers in the docs come from committed files: a table preceded by `<!-- source: PATH ... -->`
must have those files, and every number in the table must be a number of one of them at the
precision the table shows it (a value written 0.062 matches 0.0625 or 0.06249; 0 / 8 is two
numbers; 54% also matches 0.54). A table typed by hand from memory, or left behind when its
source changed, fails."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = re.compile(r"<!--\s*source:\s*(.+?)\s*-->")
NUMBER = re.compile(r"(?<![\w.])[-−+]?\d+(?:\.\d+)?(?:e[-−+]?\d+)?%?(?![\w.])")


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def sourced_tables(text: str) -> list[tuple[str, list[str]]]:
    """(source path, table rows) for every table that a source comment precedes."""
    lines, found = text.splitlines(), []
    for index, line in enumerate(lines):
        match = SOURCE.search(line)
        if not match:
            continue
        start = index + 1
        while start < len(lines) and not lines[start].startswith("|"):
            start += 1
        end = start
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        found.append((match.group(1), lines[start:end]))
    return found


def numbers_of(value) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers_of(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers_of(v)]
    return []


def shown_as(number: float, text: str) -> bool:
    if text.endswith("%"):
        return shown_as(number, text[:-1]) or shown_as(number * 100, text[:-1])
    if "e" in text:  # 2.9e-6: the mantissa's digits are the precision
        mantissa, exponent = text.split("e")
        scale = 10.0 ** int(exponent)
        return shown_as(number / scale, mantissa)
    decimals = len(text.split(".")[1]) if "." in text else 0
    return round(number, decimals) == float(text) or f"{number:.{decimals}f}" == text.lstrip("+")


def unmatched_numbers(rows: list[str], source_numbers: list[float]) -> list[str]:
    cells = [cell for row in rows[2:] for cell in row.strip("|").split("|")]  # skip the header and rule
    tokens = [t.replace("−", "-") for cell in cells for t in NUMBER.findall(cell.replace("`", ""))]
    return [t for t in tokens if not any(shown_as(n, t) for n in source_numbers)]


def test_the_checker_catches_a_number_its_source_does_not_hold():
    rows = ["| a | b |", "| --- | --- |", "| x | 0.062 |", "| y | 0 / 8 |"]
    assert unmatched_numbers(rows, [0.0625, 0.0, 8.0]) == []
    assert unmatched_numbers(rows, [0.071, 0.0, 8.0]) == ["0.062"]
    assert unmatched_numbers(rows, [0.0625, 0.0]) == ["8"]
    assert unmatched_numbers(["h", "-", "| 54% | 2.9e-6 |"], [0.54, 2.93e-6]) == []
    assert unmatched_numbers(["h", "-", "| 54% | 2.9e-6 |"], [0.55, 2.99e-6]) == ["54%", "2.9e-6"]


@pytest.mark.parametrize("document", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_sourced_table_matches_its_committed_source(document):
    for sources, rows in sourced_tables(document.read_text()):
        numbers = []
        for source in sources.split():
            path = ROOT / source
            assert path.is_file(), f"{document.name}: source {source} is not committed"
            numbers += numbers_of(json.loads(path.read_text()))
        assert rows, f"{document.name}: no table after the source comment for {sources}"
        bad = unmatched_numbers(rows, numbers)
        assert not bad, f"{document.name}: numbers not in {sources}: {bad}"


def test_the_evidence_page_sources_its_calibration_table():
    text = (ROOT / "docs" / "evidence.md").read_text()
    assert "docs/benchmarks/multiturn_calibration.json" in [s for s, _ in sourced_tables(text)]


def test_the_benchmark_tables_with_a_committed_source_name_it():
    sources = " ".join(s for s, _ in sourced_tables((ROOT / "docs" / "benchmarks.md").read_text()))
    for name in ("train_step.json", "filter_overhead.json", "precision_quiet.json"):
        assert name in sources
