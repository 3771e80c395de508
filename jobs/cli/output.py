"""How list and show commands print: a table on a terminal; tab-separated lines, never
cut, when piped (for ``cut``, ``awk``, ``sort``); JSON with ``--json``."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import typer

from jobs.cli.i18n import column

JSON_OPT = typer.Option(False, "--json", help="Print JSON (for scripts).")


def is_terminal() -> bool:
    return sys.stdout.isatty()


def print_json(data: object) -> None:
    typer.echo(json.dumps(data, ensure_ascii=False, indent=2, default=str))


def _cell(value: object) -> str:
    text = "-" if value is None or value == "" else str(value)
    # one record per line: tabs and line breaks inside a value become spaces
    return " ".join(text.split()) if any(c in text for c in "\t\r\n") else text


def table(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    title: str | None = None,
    wrap: Sequence[str] = (),
) -> None:
    """Rows under ``columns``: a rich table on a terminal (``wrap``: the columns that fold
    instead of keeping to one line), a header line and tab-separated rows otherwise."""
    if not is_terminal():
        typer.echo("\t".join(columns))
        for row in rows:
            typer.echo("\t".join(_cell(v) for v in row))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title)
    for col in columns:
        if col in wrap:
            t.add_column(column(col), overflow="fold")
        else:
            t.add_column(column(col), no_wrap=True)
    for row in rows:
        t.add_row(*(escape(_cell(v)) for v in row))
    Console().print(t)
