"""How the benchmarks report: fixed-width tables, ratios as "1.23x", counts in words, the measurements as JSON.

A table is a list of `Column`s: each formats its title and its cells to one width, so a header and its rows line up
whatever the figures, and a row printed as soon as it is measured lines up with a header printed before.
"""

import json
from dataclasses import dataclass

from ..data import default_model_path


@dataclass(frozen=True)
class Column:
    """`width` characters, `suffix` included ("x" of a ratio, "s" of seconds); `spec`: the value's format spec."""

    title: str
    width: int
    spec: str = ""
    suffix: str = ""
    align: str = ">"

    def head(self) -> str:
        return f"{self.title:{self.align}{self.width}}"

    def cell(self, value) -> str:
        return f"{value:{self.align}{self.width - len(self.suffix)}{self.spec}}{self.suffix}"


def ratio_column(title: str, width: int) -> Column:
    """A ratio of two speeds, "1.23x"."""
    return Column(title, width, ".2f", "x")


def table_head(columns: list[Column], sep: str = "") -> str:
    return sep.join(column.head() for column in columns)


def table_row(columns: list[Column], values: list, sep: str = "") -> str:
    """The cells of `values`, one per column; a row with fewer values than columns ends early."""
    return sep.join(column.cell(value) for column, value in zip(columns, values))


def ratio_line(label: str, ratio: float, note: str = "") -> str:
    """`label: 1.23x` and what more the line says."""
    return f"{label}: {ratio:.2f}x{note}"


def plural(count: int, noun: str) -> str:
    """ "1 thread", "2 threads"."""
    return f"{count} {noun}{'s' * (count != 1)}"


def best_of(repeats: int) -> str:
    """How a benchmark's figures were taken (`interleaved_runs`), as its first line says it."""
    return f"best of {plural(repeats, 'interleaved run')}"


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def write_json(path: str | None, report) -> None:
    """`--json FILE`: the measurements, also written to a file (nothing without one)."""
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2)


def shipped_or_path(path: str) -> str:
    """The checkpoint a benchmark ran, as its first line names it."""
    return "the shipped model" if path == default_model_path() else path
