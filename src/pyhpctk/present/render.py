"""Printing views: a terminal tree (colours when the output is a terminal), CSV and JSON.

The text layout follows hpcviewer: each value is shown as a number and its share of the root's
value, and the scope column is drawn as a tree. Plain text (no escape codes, ASCII-safe tree
drawing optional) is what pipes and files receive. Nothing here computes values; it only prints
a :class:`~pyhpctk.present.views.View`.

Trees can be thousands of levels deep (recursion), so nothing here recurses, and no row's size
grows with its depth: past :data:`TEXT_DEPTH_LIMIT` levels the text tree stops indenting and
prints ``[depth N]`` before the label; past :data:`JSON_NESTING_LIMIT` levels JSON stops
nesting and lists the rest of a subtree flat, each node with its depth and parent. Output and
memory stay linear in the number of rows.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import click

from pyhpctk.present.viewmodel import View, ViewNode

#: Levels the text tree indents; deeper rows keep that indentation and show ``[depth N]``.
TEXT_DEPTH_LIMIT = 40
#: Levels of ``children`` arrays JSON nests (two JSON levels each: json.loads and most other
#: parsers stop near 1,000); a node at this depth lists its descendants in ``deeper``.
JSON_NESTING_LIMIT = 100

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
    width: int | None = None  # cut rows to this many columns (None: never)

    def __post_init__(self) -> None:
        if self.tree not in ("unicode", "ascii", "indent"):
            raise ValueError(f"unknown tree style {self.tree!r}")
        if self.width is not None and self.width < 1:
            raise ValueError("width must be at least 1")


#: The least a label keeps of a row cut to the terminal's width: indentation stops growing
#: (rows show ``[depth N]``) before it leaves less.
MIN_LABEL_WIDTH = 24


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


def depth_marker(depth: int) -> str:
    """What a row deeper than :data:`TEXT_DEPTH_LIMIT` shows before its label."""
    return f"[depth {depth}] "


def _tree_lines(
    view: View, style: TextStyle, limit: int = TEXT_DEPTH_LIMIT
) -> Iterator[tuple[str, ViewNode]]:
    """(tree drawing before the label, node) in pre-order; the drawing stops growing at
    ``limit`` levels, and deeper rows carry :func:`depth_marker` instead."""
    tee, last, bar, gap = {
        "unicode": ("├─ ", "└─ ", "│  ", "   "),
        "ascii": ("|- ", "`- ", "|  ", "   "),
        "indent": ("  ", "  ", "  ", "  "),
    }[style.tree]
    stack: list[tuple[ViewNode, str, str, int]] = [(view.root, "", "", 0)]
    while stack:
        node, lead, child_lead, depth = stack.pop()
        yield lead, node
        kids = node.children
        deep = depth + 1 > limit
        for i in range(len(kids) - 1, -1, -1):
            if deep:  # the same lead string for every deeper row: no growth, no copies
                stack.append((kids[i], child_lead + depth_marker(depth + 1), child_lead, depth + 1))
                continue
            final = i == len(kids) - 1
            stack.append(
                (
                    kids[i],
                    child_lead + (last if final else tee),
                    child_lead + (gap if final else bar),
                    depth + 1,
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


def _cells(view: View, node: ViewNode, totals: list[float]) -> list[str]:
    return [
        format_value(float(v), totals[i], c.format, c.percent)
        for i, (c, v) in enumerate(zip(view.columns, node.values, strict=True))
    ]


def _cut(text: str, room: int) -> str:
    """``text`` in at most ``room`` columns, ending in ``…`` when cut."""
    if len(text) <= room:
        return text
    return text[: max(room - 1, 0)] + "…" if room > 0 else ""


def render_text(
    view: View,
    out: TextIO,
    style: TextStyle = TextStyle(),
    more: int = 0,
    footer: Sequence[str] = (),
) -> None:
    """Write the view as an aligned table with the scope tree on the right.

    Two passes over the tree (column widths, then rows), so no row is held in memory. With
    ``style.width`` every row is cut to that many columns (the label ends in ``…``), and the
    tree indents only as deep as leaves :data:`MIN_LABEL_WIDTH` columns to the labels.
    ``more``: rows a line budget left out (:mod:`pyhpctk.present.fit`), said on a line after
    the rows; ``footer``: lines after that.
    """
    totals = column_totals(view)
    heads = [c.label for c in view.columns]
    widths = [len(h) for h in heads]
    for _, node in _tree_lines(view, style):
        for i, cell in enumerate(_cells(view, node, totals)):
            widths[i] = max(widths[i], len(cell))
    limit = TEXT_DEPTH_LIMIT
    numbers_width = sum(widths) + 2 * len(widths)
    if style.width is not None:
        step = 2 if style.tree == "indent" else 3
        limit = max(
            1, min(TEXT_DEPTH_LIMIT, (style.width - numbers_width - MIN_LABEL_WIDTH) // step)
        )

    def fit(text: str) -> str:
        return text if style.width is None else _cut(text, style.width)

    sort_label = view.columns[view.sort_column].label
    title = fit(f"{view.title} - {view.kind} view, sorted by {sort_label}")
    out.write((click.style(title, bold=True) if style.color else title) + "\n")
    for note in view.notes:
        text = fit(f"note: {note}")
        out.write((click.style(text, dim=True) if style.color else text) + "\n")
    header = fit("  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True)) + "  Scope")
    out.write((click.style(header, underline=True) if style.color else header) + "\n")
    for lead, node in _tree_lines(view, style, limit):
        row = _cells(view, node, totals)
        numbers = "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True))
        label = node.label
        hidden = f" (+{node.hidden} hidden)" if node.hidden else ""
        if style.width is not None:
            room = style.width - len(numbers) - 2 - len(lead) - (2 if node.hot else 0)
            label = _cut(label, room)
            hidden = _cut(hidden, room - len(label))
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
    if more:
        text = fit(
            f"... {more:,} more rows below the line budget: --lines N shows more, "
            "--full the whole tree"
        )
        out.write((click.style(text, dim=True) if style.color else text) + "\n")
    for line in footer:
        text = fit(line)
        out.write((click.style(text, bold=True) if style.color else text) + "\n")


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


def _deeper(view: View, node: ViewNode, depth: int) -> Iterator[dict[str, Any]]:
    """``node``'s descendants in pre-order, flat: fields plus ``depth`` and ``parent`` (the
    index of the parent in this list, -1 for ``node`` itself), without ``children``."""
    count = 0
    stack: list[tuple[ViewNode, int, int]] = [(c, -1, depth + 1) for c in reversed(node.children)]
    while stack:
        current, parent, d = stack.pop()
        fields = _node_fields(view, current)
        del fields["children"]
        fields["depth"] = d
        fields["parent"] = parent
        yield fields
        me = count
        count += 1
        stack.extend((c, me, d + 1) for c in reversed(current.children))


def node_to_dict(view: View, node: ViewNode, depth: int = 0) -> dict[str, Any]:
    """A JSON-ready nested dict of a node (at ``depth``) and its shown children (NaN: null).

    Built without recursion; nesting stops at :data:`JSON_NESTING_LIMIT`, where a node with
    children gets ``"children": []`` and its descendants flat in ``"deeper"``.
    """
    top = _node_fields(view, node)
    stack: list[tuple[ViewNode, dict[str, Any], int]] = [(node, top, depth)]
    while stack:
        current, out, d = stack.pop()
        if d >= JSON_NESTING_LIMIT and current.children:
            out["deeper"] = list(_deeper(view, current, d))
            continue
        for child in current.children:
            entry = _node_fields(view, child)
            out["children"].append(entry)
            stack.append((child, entry, d + 1))
    return top


def _head(view: View) -> dict[str, Any]:
    return {
        "view": view.kind,
        "title": view.title,
        "columns": [
            {"label": c.label, "metric": c.metric, "inclusive": c.inclusive} for c in view.columns
        ],
        "sort": view.columns[view.sort_column].label,
        "notes": list(view.notes),
        "root": None,
    }


def view_to_dict(view: View) -> dict[str, Any]:
    """The view as nested dicts (use :func:`render_json` to write deep trees)."""
    out = _head(view)
    out["root"] = node_to_dict(view, view.root)
    return out


def render_json(view: View, out: TextIO) -> None:
    """Write :func:`view_to_dict` as JSON, streaming the tree without recursion.

    The tree is written node by node with an explicit stack (the whole dict is never built),
    nested as :func:`node_to_dict` nests it.
    """
    text = json.dumps(_head(view), allow_nan=False)
    prefix, _, suffix = text.rpartition('"root": null')
    out.write(prefix + '"root": ')
    stack: list[tuple[ViewNode, int, int]] = [(view.root, 0, 0)]
    while stack:
        node, state, depth = stack.pop()
        if state == 0:
            fields = _node_fields(view, node)
            del fields["children"]
            out.write(json.dumps(fields, allow_nan=False)[:-1] + ', "children": [')
            if depth >= JSON_NESTING_LIMIT and node.children:
                out.write('], "deeper": [')
                for k, entry in enumerate(_deeper(view, node, depth)):
                    out.write((", " if k else "") + json.dumps(entry, allow_nan=False))
                out.write("]}")
                continue
            stack.append((node, 1, depth))
            for i in range(len(node.children) - 1, -1, -1):
                stack.append((node.children[i], 2 if i else 0, depth + 1))
        elif state == 1:
            out.write("]}")
        else:  # a later sibling: separate it from the previous one
            out.write(", ")
            stack.append((node, 0, depth))
    out.write(suffix + "\n")
