"""A self-contained HTML report: top-down tree, flame graph and trace timeline in one file.

The report embeds its data as JSON and draws everything with a little inline JavaScript and CSS:
no network access, no external scripts, fonts or images, so it opens anywhere (and passes a
headless-browser test that watches for console errors). The tree starts with the hot path
expanded; clicking a row's toggle expands or collapses it. The flame graph is drawn from the same
tree (width = inclusive value of the sort metric); the timeline paints each trace line's function
over time, merging consecutive samples of one function and capping the segments per line so a
long trace still loads.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np

from pyhpctk.present.api import Database
from pyhpctk.present.condense import condense
from pyhpctk.present.render import TEXT_DEPTH_LIMIT, column_totals, format_value
from pyhpctk.present.traces import NoTraceError, function_of
from pyhpctk.present.viewmodel import View, ViewNode

MAX_SEGMENTS_PER_LINE = 20000
LARGE_TREE_ROWS = 20000  # above this many rows, pyview --html hides scopes below ...
LARGE_TREE_THRESHOLD = 0.1  # ... this percentage of the total, unless told otherwise


def _tree_data(view: View) -> dict[str, Any]:
    totals = column_totals(view)
    nodes: list[dict[str, Any]] = []
    stack: list[tuple[ViewNode, int]] = [(view.root, -1)]
    while stack:
        node, parent = stack.pop()
        me = len(nodes)
        nodes.append(
            {
                "p": parent,
                "l": node.label,
                "k": node.kind,
                "h": node.hot,
                "v": [None if math.isnan(v) else float(v) for v in node.values],
                "t": [
                    format_value(float(v), totals[i], c.format, c.percent)
                    for i, (c, v) in enumerate(zip(view.columns, node.values, strict=True))
                ],
            }
        )
        stack.extend((c, me) for c in reversed(node.children))
    return {
        "columns": [c.label for c in view.columns],
        "sort": view.sort_column,
        "depthLimit": TEXT_DEPTH_LIMIT,
        "nodes": nodes,
    }


def _timeline_data(db: Database) -> dict[str, Any] | None:
    exp = db.experiment
    try:
        lines = exp.traces.lines() if exp.traces is not None else None
    except NoTraceError:
        lines = None
    if not lines:
        return None
    starts = [int(line.timestamps[0]) for line in lines if len(line.timestamps)]
    ends = [int(line.timestamps[-1]) for line in lines if len(line.timestamps)]
    if not starts:
        return None
    origin, end = min(starts), max(ends)
    names: list[str] = []
    name_index: dict[str, int] = {}
    fn_of_ctx: dict[int, int] = {}
    rows = []
    labels = {p.index: exp.profile_title(p) for p in exp.profiles}
    for line in lines:
        t = line.timestamps.astype(np.int64) - origin
        ctx = line.ctx_ids.astype(np.int64)
        fn = np.empty(len(ctx), dtype=np.int64)
        for i, c in enumerate(ctx.tolist()):
            if c == 0:
                fn[i] = -1
                continue
            if c not in fn_of_ctx:
                name = function_of(exp, c)
                if name not in name_index:
                    name_index[name] = len(names)
                    names.append(name)
                fn_of_ctx[c] = name_index[name]
            fn[i] = fn_of_ctx[c]
        keep = np.ones(len(fn), dtype=bool)
        keep[1:] = fn[1:] != fn[:-1]
        idx = np.flatnonzero(keep)
        seg_start = t[idx]
        seg_end = np.append(t[idx[1:]], t[-1] if len(t) else 0)
        seg_fn = fn[idx]
        busy = seg_fn >= 0
        seg = np.stack([seg_start[busy], seg_end[busy] - seg_start[busy], seg_fn[busy]], axis=1)
        if len(seg) > MAX_SEGMENTS_PER_LINE:
            seg = seg[np.argsort(-seg[:, 1], kind="stable")[:MAX_SEGMENTS_PER_LINE]]
        rows.append({"name": labels.get(line.profile, f"#{line.profile}"), "s": seg.tolist()})
    return {"span": end - origin, "names": names, "rows": rows}


def report_view(
    db: Database,
    metrics: Sequence[str] | None,
    sort: str | None,
    depth: int | None,
    threshold: float,
    show_zero: bool,
    kind: str = "top-down",
    show_internal: bool = False,
) -> View:
    """A view for a report; a huge tree is cut so that the page stays responsive.

    Unless the user chose a depth or threshold, more than :data:`LARGE_TREE_ROWS` rows first
    hide scopes below :data:`LARGE_TREE_THRESHOLD` percent, then stop at the deepest level that
    keeps the row count under the limit (the hidden rows are counted in the heading).
    """

    def build(depth: int | None, threshold: float) -> View:
        return db.view(
            kind, metrics, sort, depth, threshold, show_zero, show_internal=show_internal
        )

    view = build(depth, threshold)
    if threshold or depth is not None or _rows(view) <= LARGE_TREE_ROWS:
        return view
    view = build(None, LARGE_TREE_THRESHOLD)
    if _rows(view) <= LARGE_TREE_ROWS:
        return view
    per_depth = np.bincount([d for d, _ in view.root.walk()])
    fits = int(np.searchsorted(np.cumsum(per_depth), LARGE_TREE_ROWS, side="right")) - 1
    return build(max(fits, 1), LARGE_TREE_THRESHOLD)


def report_views(
    db: Database,
    metrics: Sequence[str] | None,
    sort: str | None,
    depth: int | None,
    threshold: float,
    show_zero: bool,
    show_internal: bool = False,
    condensed: bool = False,
) -> dict[str, View]:
    """The top-down, bottom-up and flat views of a report (:func:`report_view` each);
    ``condensed``: as the screen shows them (:func:`pyhpctk.present.condense.condense`: calls,
    pass-through chains folded), the tree and the flame graph alike."""
    views = {
        kind: report_view(db, metrics, sort, depth, threshold, show_zero, kind, show_internal)
        for kind in ("top-down", "bottom-up", "flat")
    }
    return {kind: condense(v) for kind, v in views.items()} if condensed else views


def _rows(view: View) -> int:
    return sum(1 for _ in view.root.walk())


def _hidden_note(view: View) -> str:
    hidden = sum(node.hidden for _, node in view.root.walk())
    return f" ({hidden} small scopes hidden)" if hidden else ""


def report_data(db: Database, view: View, others: Sequence[View] = ()) -> dict[str, Any]:
    """The report's data: ``tree`` (the main view, drawn as the flame graph too), ``views``
    (the others, each a table of its own) and the trace ``timeline``."""
    return {
        "title": db.experiment.title,
        "database": db.experiment.path,
        "tree": _tree_data(view),
        "views": [dict(_tree_data(other), kind=other.kind) for other in others],
        "timeline": _timeline_data(db),
    }


_CSS = """
body{font:13px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{padding:10px 16px;background:#233;color:#fff}header h1{font-size:17px;margin:0}
section{margin:12px 16px;background:#fff;border:1px solid #ddd;border-radius:4px;padding:8px}
h2{font-size:14px;margin:2px 0 8px}
table{border-collapse:collapse;width:100%}td,th{padding:1px 6px;white-space:nowrap}
th{text-align:right;border-bottom:1px solid #ccc;font-weight:600}th.scope{text-align:left}
td.num{text-align:right;font-family:ui-monospace,monospace;color:#444}
tr.hot td.scope{color:#b00;font-weight:600}
.toggle{display:inline-block;width:14px;cursor:pointer;color:#666;user-select:none}
.depth{color:#888;font-size:11px}.k-loop{color:#077}.k-line{color:#666}.k-inlined{color:#807}.k-instruction{color:#850}
#tabs{margin-bottom:6px}.tab{border:1px solid #bbb;background:#f4f4f4;padding:2px 10px;
 margin-right:4px;cursor:pointer;border-radius:3px}.tab.on{background:#233;color:#fff}
#flame{position:relative;overflow:hidden}
.fl{position:absolute;height:17px;overflow:hidden;white-space:nowrap;font-size:11px;
 border:1px solid #fff;box-sizing:border-box;padding-left:2px;cursor:default}
#timeline canvas{width:100%;display:block}
.lane{font-size:11px;color:#333;margin-top:4px}
#legend span{display:inline-block;margin-right:10px;font-size:11px}
#legend i{display:inline-block;width:10px;height:10px;margin-right:3px;vertical-align:middle}
"""

_JS = """
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var tree = data.tree, nodes = tree.nodes;
  tree.kind = "top-down";
  // Nodes come in pre-order (parents first): every per-node pass below is one loop, with no
  // recursion and no walk to the root, however deep the tree.
  var kids = nodes.map(function () { return []; }), depth = [];
  nodes.forEach(function (n, i) {
    if (n.p >= 0) { kids[n.p].push(i); }
    depth.push(n.p >= 0 ? depth[n.p] + 1 : 0);
  });
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  var OPEN = "\\u25BE", SHUT = "\\u25B8";
  // One expandable table per view: rows open along the hot path; a toggle opens or folds a
  // row's children. Every pass is one loop over the rows in pre-order.
  function table(view, head, body) {
    var vnodes = view.nodes, vkids = vnodes.map(function () { return []; }), vdepth = [];
    vnodes.forEach(function (n, i) {
      if (n.p >= 0) { vkids[n.p].push(i); }
      vdepth.push(n.p >= 0 ? vdepth[n.p] + 1 : 0);
    });
    var tr = el("tr");
    view.columns.forEach(function (c) { tr.appendChild(el("th", "", c)); });
    tr.appendChild(el("th", "scope", "Scope"));
    head.appendChild(tr);
    var rows = [], open = vnodes.map(function (n, i) { return i === 0 || n.h; });
    function refresh() {
      var shown = [];
      vnodes.forEach(function (n, i) {
        shown.push(n.p < 0 || (shown[n.p] && open[n.p]));
        rows[i].style.display = shown[i] ? "" : "none";
      });
    }
    vnodes.forEach(function (n, i) {
      var r = el("tr", n.h ? "hot" : "");
      r.dataset.id = i;
      n.t.forEach(function (t) { r.appendChild(el("td", "num", t)); });
      var td = el("td", "scope");
      td.style.paddingLeft = (6 + 16 * Math.min(vdepth[i], view.depthLimit)) + "px";
      var tg = el("span", "toggle", vkids[i].length ? (open[i] ? OPEN : SHUT) : "");
      tg.addEventListener("click", function () {
        open[i] = !open[i];
        tg.textContent = open[i] ? OPEN : SHUT;
        refresh();
      });
      td.appendChild(tg);
      if (vdepth[i] > view.depthLimit) {
        td.appendChild(el("span", "depth", "[depth " + vdepth[i] + "] "));
      }
      td.appendChild(el("span", "k-" + n.k, n.l));
      r.appendChild(td);
      body.appendChild(r);
      rows.push(r);
    });
    refresh();
  }
  table(tree, document.getElementById("tree-head"), document.getElementById("tree-body"));
  // The other views (bottom-up, flat): tabs switch which table is shown.
  var tabs = document.getElementById("tabs"), panes = [document.getElementById("tree")];
  var buttons = [el("button", "tab on", tree.kind || "top-down")];
  (data.views || []).forEach(function (view) {
    var t = el("table", "view"), h = el("thead"), b = el("tbody");
    t.id = "view-" + view.kind;
    t.style.display = "none";
    b.id = "tree-body-" + view.kind;
    t.appendChild(h);
    t.appendChild(b);
    document.getElementById("views").appendChild(t);
    table(view, h, b);
    panes.push(t);
    buttons.push(el("button", "tab", view.kind));
  });
  buttons.forEach(function (button, k) {
    button.dataset.view = button.textContent;
    button.addEventListener("click", function () {
      panes.forEach(function (p, j) { p.style.display = j === k ? "" : "none"; });
      buttons.forEach(function (b, j) { b.className = j === k ? "tab on" : "tab"; });
    });
    tabs.appendChild(button);
  });
  function color(s) {
    var h = 0;
    for (var i = 0; i < s.length; i++) { h = (h * 31 + s.charCodeAt(i)) >>> 0; }
    return "hsl(" + (h % 360) + ",60%," + (65 + (h >>> 9) % 15) + "%)";
  }
  var flame = document.getElementById("flame"), col = tree.sort;
  var total = nodes[0].v[col] || 0, maxDepth = 0;
  var todo = [[0, 0, 100]];  // (node, left %, width %): a stack, not recursion
  while (todo.length && total > 0) {
    var item = todo.pop(), i = item[0], x = item[1], w = item[2], d = depth[i];
    if (w < 0.05) { continue; }
    maxDepth = Math.max(maxDepth, d);
    var b = el("div", "fl", nodes[i].l);
    b.style.left = x + "%";
    b.style.width = w + "%";
    b.style.top = (d * 18) + "px";
    b.style.background = color(nodes[i].l);
    b.title = nodes[i].l + " \\u2014 " + nodes[i].t[col];
    flame.appendChild(b);
    var cx = x;
    kids[i].forEach(function (k) {
      var v = nodes[k].v[col];
      if (v > 0) {
        var cw = w * v / (nodes[i].v[col] || v);
        todo.push([k, cx, cw]);
        cx += cw;
      }
    });
  }
  flame.style.height = ((maxDepth + 1) * 18 + 2) + "px";
  var tl = data.timeline, box = document.getElementById("timeline");
  if (!tl) {
    box.textContent = "This database has no traces.";
  } else {
    var legend = document.getElementById("legend");
    tl.names.slice(0, 40).forEach(function (n) {
      var s = el("span"), sw = el("i");
      sw.style.background = color(n);
      s.appendChild(sw);
      s.appendChild(document.createTextNode(n));
      legend.appendChild(s);
    });
    tl.rows.forEach(function (row) {
      box.appendChild(el("div", "lane", row.name));
      var c = el("canvas");
      c.width = 1200;
      c.height = 18;
      box.appendChild(c);
      var g = c.getContext("2d");
      if (!g) { return; }
      g.fillStyle = "#eee";
      g.fillRect(0, 0, c.width, c.height);
      row.s.forEach(function (s) {
        var x = tl.span ? s[0] / tl.span * c.width : 0;
        var w = Math.max(tl.span ? s[1] / tl.span * c.width : c.width, 0.5);
        g.fillStyle = color(tl.names[s[2]]);
        g.fillRect(x, 0, w, c.height);
      });
    });
  }
  document.body.dataset.ready = "yes";
})();
"""


# Inside <script> the HTML parser looks for "</script", "<!--" and "<script" (which can hide
# the real end tag) before any JavaScript runs, so the embedded JSON carries no "<", ">" or
# "&" at all: each is written as a JSON escape, which JSON.parse turns back into the character.
# ensure_ascii escapes everything else outside ASCII (U+2028/2029, lone surrogates).
_SURROGATE = re.compile("[\ud800-\udfff]")
_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def embedded_json(data: Any) -> str:
    """``data`` as JSON that can sit inside a ``<script>`` element whatever its strings hold."""
    return json.dumps(data, allow_nan=False, separators=(",", ":")).translate(_SCRIPT_SAFE)


def _text(value: str) -> str:
    """Text for the HTML body: markup escaped, and characters UTF-8 cannot hold (lone
    surrogates from names that were not UTF-8) shown as U+FFFD."""
    return html.escape(_SURROGATE.sub("\ufffd", value))


def render_html(db: Database, view: View, others: Sequence[View] = ()) -> str:
    """The report as one HTML string: ``view`` (top-down) with a flame graph, and ``others``
    (bottom-up, flat) as tables beside it, one tab each."""
    data = embedded_json(report_data(db, view, others))
    title = _text(db.experiment.title or "pyview report")
    sort = _text(view.columns[view.sort_column].label)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} - pyview report</title>
<style>{_CSS}</style></head>
<body>
<header><h1>{title}</h1><div>{_text(db.experiment.path)}</div></header>
<section><h2>{_text(view.kind.capitalize())} view (sorted by {sort}){_hidden_note(view)}</h2>
<div id="tabs"></div><div id="views">
<table id="tree"><thead id="tree-head"></thead><tbody id="tree-body"></tbody></table></div>
</section>
<section><h2>Flame graph</h2><div id="flame"></div></section>
<section><h2>Trace timeline</h2><div id="legend"></div><div id="timeline"></div></section>
<script type="application/json" id="report-data">{data}</script>
<script>{_JS}</script>
</body></html>
"""


def write_html(db: Database, views: View | dict[str, View], out: TextIO) -> None:
    """Write the report of one top-down view, or of :func:`report_views`' three."""
    if isinstance(views, View):
        out.write(render_html(db, views))
        return
    others = [v for kind, v in views.items() if kind != "top-down"]
    out.write(render_html(db, views["top-down"], others))
