"""The live table of a bench: one row per cell (queued, running, done, failed + reason).

On a terminal it is a `rich` Live table redrawn in place; anywhere else (a log file, CI, a pipe)
each change of a cell's status is one plain, timestamped line, so the log reads top to bottom.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live
from rich.table import Table

STATUS_STYLE = {"queued": "dim", "running": "bold yellow", "done": "green", "failed": "bold red",
                "interrupted": "magenta", "elsewhere": "cyan", "other-commit": "yellow"}


@dataclass
class Row:
    name: str
    status: str = "queued"
    progress: str = ""  # "steps logged / total"
    note: str = ""  # val success when done, the reason when failed
    started: float | None = None
    wall_s: float | None = None


class PlainDisplay:
    """A line per status change (and none per progress tick, which would flood a log)."""

    def __init__(self, names: list[str], stream=None):
        self.rows = {name: Row(name) for name in names}
        self.stream = stream or sys.stderr

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, name: str, status: str | None = None, progress: str | None = None, note: str | None = None,
               wall_s: float | None = None) -> None:
        row = self.rows[name]
        changed = status is not None and status != row.status
        if status is not None:
            row.status = status
            if status == "running":
                row.started = time.time()
        if progress is not None:
            row.progress = progress
        if note is not None:
            row.note = note
        if wall_s is not None:
            row.wall_s = wall_s
        if changed:
            self._line(row)

    def counts(self) -> str:
        tally: dict[str, int] = {}
        for row in self.rows.values():
            tally[row.status] = tally.get(row.status, 0) + 1
        return ", ".join(f"{n} {s}" for s, n in tally.items())

    def _line(self, row: Row) -> None:
        extra = f" — {row.note}" if row.note else ""
        wall = f" ({row.wall_s / 60:.1f} min)" if row.wall_s is not None and row.status != "running" else ""
        print(f"[{time.strftime('%H:%M:%S')}] {row.name}: {row.status}{wall}{extra}   [{self.counts()}]",
              file=self.stream, flush=True)


class LiveDisplay(PlainDisplay):
    """The same rows in a rich table, redrawn on every update (progress ticks included)."""

    def __init__(self, names: list[str], title: str):
        super().__init__(names)
        self.title = title
        self.console = Console(stderr=True)
        self.live = Live(self._table(), console=self.console, refresh_per_second=2, transient=False)

    def __enter__(self):
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        self.live.update(self._table())
        return self.live.__exit__(*exc)

    def _line(self, row: Row) -> None:
        pass  # the table shows it

    def update(self, name: str, **changes) -> None:
        super().update(name, **changes)
        self.live.update(self._table())

    def _table(self):
        table = Table(title=f"{self.title}  [{self.counts()}]", expand=False)
        for column in ("cell", "status", "steps", "time", "val success / reason"):
            table.add_column(column, overflow="fold")
        for row in self.rows.values():
            if row.status == "running" and row.started is not None:
                seconds = time.time() - row.started
            else:
                seconds = row.wall_s
            clock = "" if seconds is None else f"{seconds / 60:.1f} min"
            style = STATUS_STYLE.get(row.status, "")
            table.add_row(row.name, f"[{style}]{row.status}[/]", row.progress, clock, row.note)
        return table


def make_display(names: list[str], title: str, live: bool | None = None) -> PlainDisplay:
    """Live table on a terminal, plain lines otherwise (`live` forces either)."""
    if live is None:
        live = sys.stderr.isatty()
    return LiveDisplay(names, title) if live else PlainDisplay(names)
