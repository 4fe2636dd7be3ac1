"""Numbers in the docs come from committed files: a table preceded by `<!-- source: PATH ... -->`
must have those files, and every number in the table must be a number of one of them at the
precision the table shows it (a value written 0.062 matches 0.0625 or 0.06249; 0 / 8 is two
numbers; 54% also matches 0.54). A table typed by hand from memory, or left behind when its
source changed, fails. The comment sits alone on the line directly above the table.

Prose is checked the same way where a paragraph carries a source comment (anywhere in it, or on
its own line at its end): its files must exist and every number written with a decimal point, an
exponent or a percent sign must be one of theirs. Whole numbers in prose are not checked (they are
mostly step counts, sizes and settings), nor is text in backticks (commands, keys, paths)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = re.compile(r"<!--\s*source:\s*(.+?)\s*-->")
NUMBER = re.compile(r"(?<![\w.])[-−+]?\d+(?:\.\d+)?(?:e[-−+]?\d+)?%?(?![\w.])")
INLINE_CODE = re.compile(r"`[^`]*`")
PROSE_NUMBER = re.compile(r"(?<![\w.])[-−+]?\d+(?:\.\d+)?(?:e[-−+]?\d+)?%?(?!\w|\.\w)")  # may end a sentence


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _code_fenced(lines: list[str]) -> list[bool]:
    inside, flags = False, []
    for line in lines:
        fence = line.lstrip().startswith("```")
        flags.append(inside or fence)
        inside ^= fence
    return flags


def _source_comments(lines: list[str]) -> list[tuple[int, str]]:
    fenced = _code_fenced(lines)
    return [(i, m.group(1)) for i, line in enumerate(lines) if not fenced[i]
            for m in SOURCE.finditer(INLINE_CODE.sub("", line))]  # a comment quoted in backticks is text


def _introduces_table(lines: list[str], index: int) -> bool:
    """A comment alone on its line directly above a table is that table's source; any other one
    sources the paragraph it sits in."""
    alone = not SOURCE.sub("", lines[index]).strip()
    return alone and index + 1 < len(lines) and lines[index + 1].startswith("|")


def sourced_tables(text: str) -> list[tuple[str, list[str]]]:
    """(source path, table rows) for every table that a source comment precedes."""
    lines, found = text.splitlines(), []
    for index, sources in _source_comments(lines):
        if not _introduces_table(lines, index):
            continue
        start = end = index + 1
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        found.append((sources, lines[start:end]))
    return found


def sourced_paragraphs(text: str) -> list[tuple[str, str]]:
    """(source paths, paragraph text) for every source comment that does not introduce a table: the
    paragraph it sits in (the non-blank lines around it)."""
    lines, found = text.splitlines(), []
    for index, sources in _source_comments(lines):
        if _introduces_table(lines, index):
            continue
        start, end = index, index + 1
        while start > 0 and lines[start - 1].strip() and not lines[start - 1].startswith(("|", "```", "#")):
            start -= 1
        while end < len(lines) and lines[end].strip() and not lines[end].startswith(("|", "```", "#")):
            end += 1
        found.append((sources, "\n".join(lines[start:end])))
    return found


def prose_numbers(paragraph: str) -> list[str]:
    """The numbers of a paragraph the checker holds to its source: decimals, exponents, percentages,
    outside backticks and comments."""
    text = INLINE_CODE.sub(" ", SOURCE.sub(" ", paragraph))
    tokens = [t.replace("−", "-") for t in PROSE_NUMBER.findall(text)]
    return [t for t in tokens if "." in t or "e" in t or t.endswith("%")]


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
    return unmatched(tokens, source_numbers)


def unmatched(tokens: list[str], source_numbers: list[float]) -> list[str]:
    return [t for t in tokens if not any(shown_as(n, t) for n in source_numbers)]


def _source_numbers(document: Path, sources: str) -> list[float]:
    numbers = []
    for source in sources.split():
        path = ROOT / source
        assert path.is_file(), f"{document.name}: source {source} is not committed"
        numbers += numbers_of(json.loads(path.read_text()))
    return numbers


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
        numbers = _source_numbers(document, sources)
        assert rows, f"{document.name}: no table after the source comment for {sources}"
        bad = unmatched_numbers(rows, numbers)
        assert not bad, f"{document.name}: numbers not in {sources}: {bad}"


@pytest.mark.parametrize("document", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_sourced_paragraph_matches_its_committed_source(document):
    for sources, paragraph in sourced_paragraphs(document.read_text()):
        # a comment alone between blank lines sources nothing (a table's goes directly above it)
        assert SOURCE.sub("", paragraph).strip(), f"{document.name}: the comment for {sources} stands alone"
        bad = unmatched(prose_numbers(paragraph), _source_numbers(document, sources))
        assert not bad, f"{document.name}: numbers not in {sources}: {bad} in {paragraph[:120]!r}"


def test_a_source_comment_in_prose_checks_its_paragraph_not_the_next_table():
    text = "\n".join([
        "Intro.",
        "",
        "It took 101.1 s and 12% of the step, 8 steps, `--threads 1.5`.",
        "<!-- source: a.json -->",
        "",
        "| x |",
        "| --- |",
        "| 3.5 |",
        "",
        "<!-- source: b.json -->",
        "| y |",
        "| --- |",
        "| 4.5 |",
    ])
    assert sourced_tables(text) == [("b.json", ["| y |", "| --- |", "| 4.5 |"])]
    [(sources, paragraph)] = sourced_paragraphs(text)
    assert sources == "a.json" and paragraph.startswith("It took")
    assert prose_numbers(paragraph) == ["101.1", "12%"]
    assert unmatched(prose_numbers(paragraph), [101.08, 0.12]) == []
    assert unmatched(prose_numbers(paragraph), [100.0, 0.12]) == ["101.1"]
    assert sourced_paragraphs("Mark prose with `<!-- source: PATH -->`.") == []
    assert sourced_paragraphs("<!-- source: d.json -->\n\n| z |\n| --- |\n| 1 |") == [("d.json", "<!-- source: d.json -->")]
    inline = "Retrieval rose to 0.81 (<!-- source: c.json -->) by step 3, MI to 1.60. Torch 2.13.0."
    assert sourced_paragraphs(inline) == [("c.json", inline)] and prose_numbers(inline) == ["0.81", "1.60"]


def test_the_evidence_page_sources_its_calibration_table():
    text = (ROOT / "docs" / "evidence.md").read_text()
    assert "docs/benchmarks/multiturn_calibration.json" in [s for s, _ in sourced_tables(text)]


def test_the_benchmark_tables_with_a_committed_source_name_it():
    sources = " ".join(s for s, _ in sourced_tables((ROOT / "docs" / "benchmarks.md").read_text()))
    for name in ("train_step.json", "filter_overhead.json", "precision_quiet.json"):
        assert name in sources
