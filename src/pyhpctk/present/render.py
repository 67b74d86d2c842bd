"""Printing views: a terminal tree (colours when the output is a terminal), CSV and JSON.

The text layout follows hpcviewer: each value is shown as a number and its share of the root's
value, and the scope column is drawn as a tree. Plain text (no escape codes, ASCII-safe tree
drawing optional) is what pipes and files receive. Nothing here computes values; it only prints
a :class:`~pyhpctk.present.views.View`.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import click

from pyhpctk.present.views import View, ViewNode

KIND_STYLES: dict[str, dict[str, Any]] = {
    "root": {"bold": True},
    "entry": {"bold": True},
    "function": {},
    "inlined": {"fg": "magenta"},
    "loop": {"fg": "cyan"},
    "line": {"fg": "bright_black"},
    "instruction": {"fg": "yellow"},
    "module": {"bold": True},
    "file": {"fg": "blue"},
}


@dataclass(frozen=True, slots=True)
class TextStyle:
    """How to draw text: colours on/off; the tree as Unicode or ASCII glyphs, or indentation."""

    color: bool = False
    tree: str = "unicode"  # "unicode" (box drawing), "ascii" (|- `-) or "indent" (spaces only)

    def __post_init__(self) -> None:
        if self.tree not in ("unicode", "ascii", "indent"):
            raise ValueError(f"unknown tree style {self.tree!r}")


def format_value(value: float, total: float, fmt: str | None = None, percent: bool = True) -> str:
    """``1.21e+00  50.0%`` (hpcviewer's number + percent); empty for NaN."""
    if value is None or math.isnan(value):
        return ""
    if fmt:
        try:
            return (fmt % value).strip()
        except (TypeError, ValueError):
            pass
    text = f"{value:.2e}"
    if percent and total and math.isfinite(total) and total != 0:
        text += f" {100.0 * value / total:5.1f}%"
    elif percent:
        text += "       "
    return text


def _tree_lines(view: View, style: TextStyle) -> Iterator[tuple[str, ViewNode]]:
    tee, last, bar, gap = {
        "unicode": ("├─ ", "└─ ", "│  ", "   "),
        "ascii": ("|- ", "`- ", "|  ", "   "),
        "indent": ("  ", "  ", "  ", "  "),
    }[style.tree]
    stack: list[tuple[ViewNode, str, str]] = [(view.root, "", "")]
    while stack:
        node, lead, child_lead = stack.pop()
        yield lead, node
        kids = node.children
        for i in range(len(kids) - 1, -1, -1):
            final = i == len(kids) - 1
            stack.append(
                (
                    kids[i],
                    child_lead + (last if final else tee),
                    child_lead + (gap if final else bar),
                )
            )


def column_totals(view: View) -> list[float]:
    """What each column's percentages are relative to: the root's inclusive value."""
    inclusive = {c.metric: i for i, c in enumerate(view.columns) if c.inclusive}
    out = []
    for i, c in enumerate(view.columns):
        j = inclusive.get(c.metric, i)
        out.append(float(view.root.values[j]))
    return out


def render_text(view: View, out: TextIO, style: TextStyle = TextStyle()) -> None:
    """Write the view as an aligned table with the scope tree on the right."""
    totals = column_totals(view)
    cells: list[list[str]] = []
    rows = list(_tree_lines(view, style))
    for _, node in rows:
        cells.append(
            [
                format_value(float(v), totals[i], c.format, c.percent)
                for i, (c, v) in enumerate(zip(view.columns, node.values, strict=True))
            ]
        )
    heads = [c.label for c in view.columns]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(heads)]
    sort_label = view.columns[view.sort_column].label
    title = f"{view.title} - {view.kind} view, sorted by {sort_label}"
    out.write((click.style(title, bold=True) if style.color else title) + "\n")
    header = "  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True)) + "  Scope"
    out.write((click.style(header, underline=True) if style.color else header) + "\n")
    for (lead, node), row in zip(rows, cells, strict=True):
        numbers = "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True))
        label = node.label
        hidden = f" (+{node.hidden} hidden)" if node.hidden else ""
        if style.color:
            kw = dict(KIND_STYLES.get(node.kind, {}))
            if node.hot and node.kind not in ("root",):
                kw = {"fg": "red", "bold": True}
            label = click.style(label, **kw)
            hidden = click.style(hidden, dim=True) if hidden else ""
            mark = click.style("🔥 ", fg="red") if node.hot and node is not view.root else ""
        else:
            mark = "* " if node.hot and node is not view.root else ""
        out.write(f"{numbers}  {lead}{mark}{label}{hidden}\n")


def _flatten(view: View) -> Iterator[tuple[int, int, int, ViewNode]]:
    """(row id, parent row id, depth, node) in pre-order."""
    counter = 0
    stack: list[tuple[ViewNode, int, int]] = [(view.root, -1, 0)]
    while stack:
        node, parent, depth = stack.pop()
        me = counter
        counter += 1
        yield me, parent, depth, node
        stack.extend((c, me, depth + 1) for c in reversed(node.children))


def render_csv(view: View, out: TextIO) -> None:
    """One row per node: id, parent, depth, scope, kind, ctx_id, file, line, module, values."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(
        ["id", "parent", "depth", "scope", "kind", "ctx_id", "file", "line", "module"]
        + [c.label for c in view.columns]
    )
    for me, parent, depth, node in _flatten(view):
        writer.writerow(
            [
                me,
                "" if parent < 0 else parent,
                depth,
                node.label,
                node.kind,
                "" if node.ctx_id is None else node.ctx_id,
                node.file or "",
                node.line or "",
                node.module or "",
            ]
            + ["" if math.isnan(v) else repr(float(v)) for v in node.values]
        )


def _node_fields(view: View, node: ViewNode) -> dict[str, Any]:
    return {
        "scope": node.label,
        "kind": node.kind,
        "ctx_id": node.ctx_id,
        "file": node.file,
        "line": node.line or None,
        "module": node.module,
        "hot": node.hot,
        "hidden_children": node.hidden,
        "values": {
            c.label: None if math.isnan(v) else float(v)
            for c, v in zip(view.columns, node.values, strict=True)
        },
        "children": [],
    }


def node_to_dict(view: View, node: ViewNode) -> dict[str, Any]:
    """A JSON-ready nested dict of a node and its shown children (NaN becomes null).

    Built without recursion: calling context trees can be deeper than Python's stack.
    """
    top = _node_fields(view, node)
    stack: list[tuple[ViewNode, dict[str, Any]]] = [(node, top)]
    while stack:
        current, out = stack.pop()
        for child in current.children:
            entry = _node_fields(view, child)
            out["children"].append(entry)
            stack.append((child, entry))
    return top


def view_to_dict(view: View) -> dict[str, Any]:
    """The view as nested dicts (use :func:`render_json` to write deep trees)."""
    return {
        "view": view.kind,
        "title": view.title,
        "columns": [
            {"label": c.label, "metric": c.metric, "inclusive": c.inclusive} for c in view.columns
        ],
        "sort": view.columns[view.sort_column].label,
        "root": node_to_dict(view, view.root),
    }


def render_json(view: View, out: TextIO) -> None:
    """Write :func:`view_to_dict` as JSON, streaming the tree without recursion.

    ``json.dump`` recurses once per nesting level, and a calling context tree can be thousands
    of levels deep, so the ``children`` arrays are opened and closed here with an explicit stack.
    """
    head = view_to_dict(view)
    head["root"] = None
    text = json.dumps(head, allow_nan=False)
    prefix, _, suffix = text.rpartition('"root": null')
    out.write(prefix + '"root": ')
    stack: list[tuple[ViewNode, int]] = [(view.root, 0)]
    while stack:
        node, state = stack.pop()
        if state == 0:
            fields = _node_fields(view, node)
            del fields["children"]
            out.write(json.dumps(fields, allow_nan=False)[:-1] + ', "children": [')
            stack.append((node, 1))
            for i in range(len(node.children) - 1, -1, -1):
                stack.append((node.children[i], 2 if i else 0))
        elif state == 1:
            out.write("]}")
        else:  # a later sibling: separate it from the previous one
            out.write(", ")
            stack.append((node, 0))
    out.write(suffix + "\n")
