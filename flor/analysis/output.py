"""Writing rows out: aligned text tables, CSV and JSON lines, for the ``flor`` commands."""

from __future__ import annotations

import csv
import json
import math
from typing import IO, AbstractSet, Any, Sequence

__all__ = ["inert_cell", "write_rows", "text_table"]

#: what makes a spreadsheet read a cell as a formula (``=HYPERLINK(...)``, ``+cmd|...``, ``@SUM``)
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def inert_cell(v: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: a string starting like a formula gets a leading
    ``'`` (numbers are left as they are: ``-0.5`` is a number, not a formula).

    >>> print(inert_cell('=HYPERLINK("http://x","y")'), inert_cell(-0.5), inert_cell("lr"))
    '=HYPERLINK("http://x","y") -0.5 lr
    """
    return "'" + v if isinstance(v, str) and v.startswith(_FORMULA) else v


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.6g}"
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v)


def text_table(columns: Sequence[str], rows: Sequence[dict], *, marked: AbstractSet[str] = frozenset(),
               mark: str = "*") -> str:
    """An aligned table; the headers of ``marked`` columns end in ``mark``. Numbers are
    shown with 6 significant digits (CSV and JSON keep every digit)."""
    head = [c + (mark if c in marked else "") for c in columns]
    body = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(h), *(len(b[i]) for b in body)]) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    for b in body:
        lines.append("  ".join(v.ljust(w) for v, w in zip(b, widths)).rstrip())
    return "\n".join(lines)


def write_rows(out: IO[str], columns: Sequence[str], rows: Sequence[dict], fmt: str, *,
               marked: AbstractSet[str] = frozenset(), legend: str | None = None, raw: bool = False) -> None:
    """Write ``rows`` (dicts) as ``table``, ``csv`` or ``jsonl`` with these ``columns``. CSV cells
    that would start a formula are neutralised (``inert_cell``) unless ``raw``: names and values
    come from a store, which anyone may write."""
    if fmt == "jsonl":
        for r in rows:
            out.write(json.dumps({c: r.get(c) for c in columns}) + "\n")
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        cell = (lambda v: v) if raw else inert_cell
        writer.writerow([cell(c) for c in columns])
        for r in rows:
            writer.writerow(["" if r.get(c) is None else
                             cell(json.dumps(r[c]) if isinstance(r[c], (list, dict)) else r[c]) for c in columns])
    else:
        out.write(text_table(columns, rows, marked=marked) + "\n")
        if legend and marked:
            out.write(legend + "\n")
