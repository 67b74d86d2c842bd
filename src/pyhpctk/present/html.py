"""A self-contained HTML report: top-down tree, flame graph, trace timeline and the warps of
traced kernels in one file.

The report embeds its data as JSON and draws everything with a little inline JavaScript and CSS:
no network access, no external scripts, fonts or images, so it opens anywhere (and passes a
headless-browser test that watches for console errors). Each table starts with what the text
screen shows (:func:`first_screen`), an open row's other children folded into one row ``… 13
smaller rows (8.7 %)`` that a click opens; clicking a row's toggle expands or collapses it.
The flame graph is drawn from the same tree (width = inclusive value of the sort metric); the
timeline paints each trace line's function over time, merging consecutive samples of one
function and capping the segments per line so a long trace still loads. Traced kernels' warp
lines (issue #34) are drawn apart, for the first traced launch's window: a lane per SM and warp
slot, coloured by PTX block, under the text of ``pyview --warps``; the section is hidden without
them.
"""

from __future__ import annotations

import html
import io
import json
import math
import re
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np

from pyhpctk.present import fit, memory
from pyhpctk.present.api import Database
from pyhpctk.present.condense import condense
from pyhpctk.present.render import TEXT_DEPTH_LIMIT, column_totals, format_value
from pyhpctk.present.traces import LineSummary, NoTraceError, function_of, summarize
from pyhpctk.present.viewmodel import HOT_PATH_SHARE, View, ViewNode
from pyhpctk.present.warps import render_warp_summary, warp_summary

MAX_SEGMENTS_PER_LINE = 20000
LEGEND_SIZE = 10  # the timeline's functions with a colour of their own; the rest are "other"
QUIET_SHARE = 0.01  # threads of less CPU time than this share of the busiest's share one lane
_RAW_FRAME = re.compile(r"(.+)\+0x[0-9a-f]+( \[.+\])?")
_UNKNOWN_FUNCTION = re.compile(r"(\S+) @ 0x[0-9a-f]+")  # pyprof's libc.so.6 @ 0x85e50
LARGE_TREE_ROWS = 20000  # above this many rows, pyview --html hides scopes below ...
LARGE_TREE_THRESHOLD = 0.1  # ... this percentage of the total, unless told otherwise
#: Lines (besides the root) a view's table fills at first, unless ``--lines`` says otherwise:
#: about what a browser window shows of the table above the fold.
HTML_LINES = 40


def _cells(view: View, values: Any, totals: list[float]) -> list[str]:
    return [
        format_value(float(v), totals[i], c.format, c.percent)
        for i, (c, v) in enumerate(zip(view.columns, values, strict=True))
    ]


def _smaller(view: View, cut: list[ViewNode], totals: list[float]) -> dict[str, Any]:
    """The row standing for an open row's children the screen leaves out: ``… 23 smaller rows
    (2.9 %)``, the share being theirs of the total (inclusive, sort metric), and the sums of
    its columns that add up (a ratio does not)."""
    sums = np.nansum([n.values for n in cut], axis=0)
    values = [v if c.percent else math.nan for c, v in zip(view.columns, sums, strict=True)]
    key = fit.inclusive_column(view)
    share = 100.0 * float(values[key]) / totals[key] if totals[key] else 0.0
    rows = f"{len(cut)} smaller row{'s' * (len(cut) > 1)}"
    return {"l": f"… {rows} ({share:.1f} %)", "t": _cells(view, values, totals)}


def _folds(view: View, kept: set[int]) -> int:
    """How many "smaller rows" rows the page shows with the rows ``kept``."""
    return sum(
        0 < sum(id(c) in kept for c in node.children) < len(node.children)
        for _, node in view.root.walk()
        if id(node) in kept
    )


def first_screen(view: View, lines: int | None) -> set[int]:
    """The rows a table shows at first, by ``id``: those the text screen shows (:func:`pyhpctk.
    present.fit.chosen`) in the most rows that fit in ``lines`` lines together with the rows
    standing for the children it cuts (:func:`_smaller`, one per open row); None: the hot path
    open, every row under an open one shown."""
    if lines is None:
        return fit.chosen(view, HOT_PATH_SHARE, None)[0]
    # Rows and "smaller rows" rows together never shrink as the screen grows (a row the screen
    # adds opens a "smaller rows" row or closes one, never both): the largest that fits is
    # found by bisection.
    low, high = 0, lines
    while low < high:
        rows = (low + high + 1) // 2
        if rows + _folds(view, fit.chosen(view, None, rows)[0]) <= lines:
            low = rows
        else:
            high = rows - 1
    return fit.chosen(view, None, low)[0]


def _tree_data(view: View, lines: int | None) -> dict[str, Any]:
    """The view's rows in pre-order, each with ``s`` when the page shows it at first
    (:func:`first_screen`); an open row whose children the screen cuts has ``m``, the one row
    that stands for them (:func:`_smaller`)."""
    totals = column_totals(view)
    kept = first_screen(view, lines)
    nodes: list[dict[str, Any]] = []
    stack: list[tuple[ViewNode, int]] = [(view.root, -1)]
    while stack:
        node, parent = stack.pop()
        me = len(nodes)
        row = {
            "p": parent,
            "l": node.label,
            "k": node.kind,
            "h": node.hot,
            "s": id(node) in kept,
            "v": [None if math.isnan(v) else float(v) for v in node.values],
            "t": _cells(view, node.values, totals),
        }
        cut = [c for c in node.children if id(c) not in kept]
        if row["s"] and cut and len(cut) < len(node.children):
            row["m"] = _smaller(view, cut, totals)
        nodes.append(row)
        stack.extend((c, me) for c in reversed(node.children))
    return {
        "columns": [c.label for c in view.columns],
        "sort": view.sort_column,
        "depthLimit": TEXT_DEPTH_LIMIT,
        "nodes": nodes,
    }


def _timeline_name(exp: Any, ctx: int) -> str:
    """What a sample is painted as: its function; a raw native frame (``libc.so.6+0xcf438``)
    and a function no symbol names (``libc.so.6 @ 0x85e50``) as their library, and one named
    by its nearest symbol (``omp_in_final+0xa0 [libgomp.so]``, older databases) as that
    symbol, so that one library or function is one colour, not one per address."""
    name = function_of(exp, ctx)
    unknown = _UNKNOWN_FUNCTION.fullmatch(name)
    if unknown is not None:
        return f"{unknown.group(1)} (native)"
    raw = _RAW_FRAME.fullmatch(name)
    if raw is None:
        return name
    return f"{raw.group(1)}{raw.group(2)}" if raw.group(2) else f"{raw.group(1)} (native)"


def _lane(line: Any, origin: int, fn_of_ctx: dict[int, int], index: Any) -> np.ndarray[Any, Any]:
    """One trace line's segments: (start, length, function) rows, consecutive samples of one
    function merged, idle samples left out."""
    t = line.timestamps.astype(np.int64) - origin
    ctx = line.ctx_ids.astype(np.int64)
    fn = np.empty(len(ctx), dtype=np.int64)
    for i, c in enumerate(ctx.tolist()):
        if c not in fn_of_ctx:
            fn_of_ctx[c] = -1 if c == 0 else index(c)
        fn[i] = fn_of_ctx[c]
    keep = np.ones(len(fn), dtype=bool)
    keep[1:] = fn[1:] != fn[:-1]
    idx = np.flatnonzero(keep)
    seg_start = t[idx]
    seg_end = np.append(t[idx[1:]], t[-1] if len(t) else 0)
    seg_fn = fn[idx]
    busy = seg_fn >= 0
    return np.stack([seg_start[busy], seg_end[busy] - seg_start[busy], seg_fn[busy]], axis=1)


def _quiet(summaries: list[LineSummary]) -> list[bool]:
    """Which lines are CPU threads whose CPU time is under :data:`QUIET_SHARE` of the busiest
    thread's (their sampled time where the database has no CPU time); GPU streams never are."""
    cpu = [s.busy_ns if s.cpu_ns is None else s.cpu_ns for s in summaries]
    most = max((c for c, s in zip(cpu, summaries, strict=True) if not s.is_gpu), default=0)
    return [not s.is_gpu and c < QUIET_SHARE * most for c, s in zip(cpu, summaries, strict=True)]


def _packed(
    lanes: list[tuple[str, np.ndarray[Any, Any], LineSummary | None]],
    names: list[str],
    span: int,
    folded: bool = True,
) -> dict[str, Any]:
    """Lanes as the page draws them: the legend (the names holding most time, the rest
    "other"), the quiet threads folded into one lane (``folded``), segments capped per lane."""
    held = np.zeros(len(names))
    for _, seg, _ in lanes:
        np.add.at(held, seg[:, 2], seg[:, 1])
    legend = [int(i) for i in np.argsort(-held, kind="stable")[:LEGEND_SIZE] if held[i] > 0]
    slot = np.full(len(names), -1, dtype=np.int64)
    slot[legend] = np.arange(len(legend))
    quiet = _quiet([summary for _, _, summary in lanes if summary is not None])
    rows = []
    if folded and sum(quiet) > 1:
        # The quiet threads (a pool's short-lived helpers, threads that only waited) are one
        # lane: a row each would bury the threads that work.
        merged = np.concatenate([seg for (_, seg, _), q in zip(lanes, quiet, strict=True) if q])
        title = f"{sum(quiet)} quiet threads (each < {QUIET_SHARE:.0%} of the busiest's CPU time)"
        lanes = [lane for lane, q in zip(lanes, quiet, strict=True) if not q]
        lanes.append((title, merged[np.argsort(merged[:, 0], kind="stable")], None))
    for name, seg, _ in lanes:
        if len(seg) > MAX_SEGMENTS_PER_LINE:
            seg = seg[np.argsort(-seg[:, 1], kind="stable")[:MAX_SEGMENTS_PER_LINE]]
        rows.append({"name": name, "s": seg.tolist()})
    return {
        "span": span,
        "seconds": span / 1e9,
        "names": names,
        "legend": [names[i] for i in legend],
        "slot": slot.tolist(),
        "rows": rows,
    }


def _timeline_data(db: Database) -> dict[str, Any] | None:
    """The trace lines as lanes of segments, with what the page needs to read them: the span
    in seconds (its time axis), the legend (the functions holding most time, the rest
    "other") and the quiet threads folded into one lane (issue #36 item 7). Warp lines are
    left to :func:`_warp_data` (microseconds, lost at the program's scale)."""
    exp = db.experiment
    try:
        lines = exp.traces.lines() if exp.traces is not None else None
    except NoTraceError:
        lines = None
    if not lines:
        return None
    # What each line's thread did (its CPU time, whether it is a GPU stream), line by line.
    done = {id(line): summary for line, summary in zip(lines, summarize(exp), strict=True)}
    lines = [line for line in lines if not done[id(line)].is_warp]
    sampled = [line for line in lines if len(line.timestamps)]
    if not sampled:
        return None
    origin = min(int(line.timestamps[0]) for line in sampled)
    end = max(int(line.timestamps[-1]) for line in sampled)
    name_index: dict[str, int] = {}

    def index(ctx: int) -> int:
        return name_index.setdefault(_timeline_name(exp, ctx), len(name_index))

    fn_of_ctx: dict[int, int] = {}
    labels = {p.index: exp.profile_title(p) for p in exp.profiles}
    lanes: list[tuple[str, np.ndarray[Any, Any], LineSummary | None]] = []
    for line in lines:
        seg = _lane(line, origin, fn_of_ctx, index)
        lanes.append((labels.get(line.profile, f"#{line.profile}"), seg, done[id(line)]))
    return _packed(lanes, list(name_index), end - origin)


def _first_launch(lines: Sequence[Any]) -> tuple[int, int]:
    """The time window of the first traced launch: from the first warp's start, as long as
    the next warp starts before every earlier one has ended (a launch's warps overlap; the next
    launch starts after the last of them)."""
    warps: list[tuple[int, int]] = []
    for line in lines:
        t, busy = line.timestamps.astype(np.int64), line.ctx_ids != 0
        starts = np.flatnonzero(busy & np.r_[True, ~busy[:-1]])
        ends = np.flatnonzero(~busy & np.r_[False, busy[:-1]])
        warps += [(int(t[a]), int(t[b])) for a, b in zip(starts, ends, strict=False)]
    warps.sort()
    start, end = warps[0]
    for first, last in warps[1:]:
        if first > end:
            break
        end = max(end, last)
    return start, end


def _warp_data(db: Database) -> dict[str, Any] | None:
    """The first traced launch's warps, a lane per SM and warp slot coloured by PTX block, and
    the warp summary's text (``pyview --warps``); None without warp lines."""
    exp = db.experiment
    warp_lines = {p.index: p for p in exp.profiles if p.is_warp}
    if exp.traces is None or not warp_lines:
        return None
    lines = [ln for ln in exp.traces.lines() if ln.profile in warp_lines and len(ln.ctx_ids) > 1]
    if not lines:
        return None
    start, end = _first_launch(lines)
    name_index: dict[str, int] = {}

    def index(ctx: int) -> int:
        return name_index.setdefault(_timeline_name(exp, ctx), len(name_index))

    fn_of_ctx: dict[int, int] = {}
    lanes: list[tuple[str, np.ndarray[Any, Any], LineSummary | None]] = []

    def place(line: Any) -> tuple[int, int, int]:
        prof = warp_lines[line.profile]
        device, sm, slot = (prof.element(kind) or 0 for kind in ("GPUDEVICE", "CORE", "THREAD"))
        return device, sm, slot

    for line in sorted(lines, key=place):
        seg = _lane(line, start, fn_of_ctx, index)
        seg = seg[(seg[:, 0] >= 0) & (seg[:, 0] < end - start)]
        if len(seg):
            prof = warp_lines[line.profile]
            lanes.append((f"GPU {prof.element('GPUDEVICE')} {prof.warp_label}", seg, None))
    text = io.StringIO()
    render_warp_summary(warp_summary(exp), text)
    return dict(_packed(lanes, list(name_index), end - start, folded=False), text=text.getvalue())


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


def report_data(
    db: Database, view: View, others: Sequence[View] = (), lines: int | None = HTML_LINES
) -> dict[str, Any]:
    """The report's data: ``tree`` (the main view, drawn as the flame graph too), ``views``
    (the others, each a table of its own) and the trace ``timeline``; each table shows at first
    what fits in ``lines`` lines (:func:`first_screen`)."""
    return {
        "title": db.experiment.title,
        "database": db.experiment.path,
        "tree": _tree_data(view, lines),
        "views": [dict(_tree_data(other, lines), kind=other.kind) for other in others],
        "timeline": _timeline_data(db),
        "warps": _warp_data(db),
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
tr.more{cursor:pointer;color:#666;font-style:italic}tr.more:hover{background:#f0f4f8}
.toggle{display:inline-block;width:14px;cursor:pointer;color:#666;user-select:none}
.depth{color:#888;font-size:11px}.k-loop{color:#077}.k-line{color:#666}.k-inlined{color:#807}.k-instruction{color:#850}
#tabs{margin-bottom:6px}.tab{border:1px solid #bbb;background:#f4f4f4;padding:2px 10px;
 margin-right:4px;cursor:pointer;border-radius:3px}.tab.on{background:#233;color:#fff}
#flame{position:relative;overflow:hidden}
.fl{position:absolute;height:17px;overflow:hidden;white-space:nowrap;font-size:11px;
 border:1px solid #fff;box-sizing:border-box;padding-left:2px;cursor:default}
#timeline canvas,#timeaxis canvas,#warps canvas,#warp-axis canvas{width:100%;display:block}
.lane{font-size:11px;color:#333;margin-top:4px}
#legend span,#warp-legend span{display:inline-block;margin-right:10px;font-size:11px}
#legend i,#warp-legend i{display:inline-block;width:10px;height:10px;margin-right:3px;
 vertical-align:middle}
#warp-summary{font-size:11px;overflow-x:auto}
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
  // One expandable table per view. At first the rows the text screen keeps are shown (n.s)
  // and open where it shows their children; an open row's children it cut are one row
  // "\u2026 N smaller rows (X %)" (n.m), which a click replaces by them. A toggle opens or
  // folds a row's children. Every pass is one loop over the rows in pre-order.
  function table(view, head, body) {
    var vnodes = view.nodes, vkids = vnodes.map(function () { return []; }), vdepth = [];
    var chosenKid = vnodes.map(function () { return false; }), last = [];
    vnodes.forEach(function (n, i) {
      if (n.p >= 0) { vkids[n.p].push(i); }
      if (n.p >= 0 && n.s) { chosenKid[n.p] = true; }
      vdepth.push(n.p >= 0 ? vdepth[n.p] + 1 : 0);
      last.push(i);
    });
    // The last row of each row's subtree: a row's "smaller rows" row comes after it.
    for (var j = vnodes.length - 1; j > 0; j--) {
      last[vnodes[j].p] = Math.max(last[vnodes[j].p], last[j]);
    }
    var closes = vnodes.map(function () { return []; });
    for (j = vnodes.length - 1; j >= 0; j--) {
      if (vnodes[j].m) { closes[last[j]].push(j); }  // the deepest row's first
    }
    var tr = el("tr");
    view.columns.forEach(function (c) { tr.appendChild(el("th", "", c)); });
    tr.appendChild(el("th", "scope", "Scope"));
    head.appendChild(tr);
    var rows = [], more = [];
    var open = vnodes.map(function (n, i) { return Boolean(n.s) && chosenKid[i]; });
    // all[i]: every child of row i is shown when it is open, not only those the screen chose.
    var all = chosenKid.map(function (c) { return !c; });
    function refresh() {
      var shown = [];
      vnodes.forEach(function (n, i) {
        shown.push(n.p < 0 || (shown[n.p] && open[n.p] && (all[n.p] || Boolean(n.s))));
        rows[i].style.display = shown[i] ? "" : "none";
      });
      more.forEach(function (m) {
        m[1].style.display = shown[m[0]] && open[m[0]] && !all[m[0]] ? "" : "none";
      });
    }
    function indent(td, d) {
      td.style.paddingLeft = (6 + 16 * Math.min(d, view.depthLimit)) + "px";
      if (d > view.depthLimit) { td.appendChild(el("span", "depth", "[depth " + d + "] ")); }
    }
    function smaller(p) {
      var r = el("tr", "more"), td = el("td", "scope");
      r.dataset.parent = p;
      vnodes[p].m.t.forEach(function (t) { r.appendChild(el("td", "num", t)); });
      td.appendChild(el("span", "toggle", ""));
      indent(td, vdepth[p] + 1);
      td.appendChild(el("span", "", vnodes[p].m.l));
      r.appendChild(td);
      r.addEventListener("click", function () { all[p] = true; refresh(); });
      body.appendChild(r);
      more.push([p, r]);
    }
    vnodes.forEach(function (n, i) {
      var r = el("tr", n.h ? "hot" : "");
      r.dataset.id = i;
      n.t.forEach(function (t) { r.appendChild(el("td", "num", t)); });
      var td = el("td", "scope");
      var tg = el("span", "toggle", vkids[i].length ? (open[i] ? OPEN : SHUT) : "");
      tg.addEventListener("click", function () {
        open[i] = !open[i];
        tg.textContent = open[i] ? OPEN : SHUT;
        refresh();
      });
      td.appendChild(tg);
      indent(td, vdepth[i]);
      td.appendChild(el("span", "k-" + n.k, n.l));
      r.appendChild(td);
      body.appendChild(r);
      rows.push(r);
      closes[i].forEach(smaller);
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
    // One function, one colour, whichever line called it ("name \u2190 file: line").
    b.style.background = color(nodes[i].l.split(" \u2190 ")[0]);
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
  // The legend's names have a colour each, from one palette told apart at a glance;
  // everything else is "other", in grey.
  var PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
                 "#ff9da7", "#9c755f", "#2f4b7c"], OTHER = "#c8c8c8";
  // A time axis: ticks at 1, 2 or 5 times a power of ten seconds, about eight of them.
  function axis(tl, width) {
    var c = el("canvas"), g;
    c.width = width;
    c.height = 18;
    g = c.getContext("2d");
    if (!g || !(tl.seconds > 0)) { return c; }
    var raw = tl.seconds / 8, step = Math.pow(10, Math.floor(Math.log10(raw)));
    if (raw / step >= 5) { step *= 5; } else if (raw / step >= 2) { step *= 2; }
    var digits = Math.max(0, -Math.floor(Math.log10(step)));
    g.fillStyle = "#333";
    g.strokeStyle = "#888";
    g.font = "11px sans-serif";
    for (var t = 0; t <= tl.seconds + step / 1e6; t += step) {
      var x = Math.round(t / tl.seconds * (width - 1));
      g.beginPath();
      g.moveTo(x + 0.5, 0);
      g.lineTo(x + 0.5, 5);
      g.stroke();
      var text = t.toFixed(digits) + " s", w = g.measureText(text).width;
      g.fillText(text, Math.min(Math.max(x - w / 2, 0), width - w), 16);
    }
    return c;
  }
  // One timeline (the trace lines, or the warps of a traced launch): legend, axis, lanes.
  function paint(tl, box, legend, timeaxis) {
    function laneColor(fn) { var k = tl.slot[fn]; return k >= 0 ? PALETTE[k] : OTHER; }
    var keys = tl.legend.map(function (n, k) { return [n, PALETTE[k]]; });
    if (tl.slot.some(function (k) { return k < 0; })) { keys.push(["other", OTHER]); }
    keys.forEach(function (key) {
      var s = el("span"), sw = el("i");
      sw.style.background = key[1];
      s.appendChild(sw);
      s.appendChild(document.createTextNode(key[0]));
      legend.appendChild(s);
    });
    timeaxis.appendChild(axis(tl, 1200));
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
        g.fillStyle = laneColor(s[2]);
        g.fillRect(x, 0, w, c.height);
      });
    });
  }
  var tl = data.timeline, box = document.getElementById("timeline");
  if (!tl) {
    box.textContent = "This database has no traces.";
  } else {
    paint(tl, box, document.getElementById("legend"), document.getElementById("timeaxis"));
  }
  var warps = data.warps, wbox = document.getElementById("warps");
  if (!warps) {
    wbox.parentNode.style.display = "none";
  } else {
    document.getElementById("warp-summary").textContent = warps.text;
    paint(warps, wbox, document.getElementById("warp-legend"),
          document.getElementById("warp-axis"));
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


def render_html(
    db: Database, view: View, others: Sequence[View] = (), lines: int | None = HTML_LINES
) -> str:
    """The report as one HTML string: ``view`` (top-down) with a flame graph, and ``others``
    (bottom-up, flat) as tables beside it, one tab each, showing at first what the text screen
    shows that fits in ``lines`` lines (None: the hot path open)."""
    data = embedded_json(report_data(db, view, others, lines))
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
<section><h2>Trace timeline</h2><div id="legend"></div><div id="timeaxis"></div>
<div id="timeline"></div></section>
<section><h2>Warps of the first traced launch (a lane per SM and warp slot, coloured by PTX
block)</h2><pre id="warp-summary"></pre><div id="warp-legend"></div><div id="warp-axis"></div>
<div id="warps"></div></section>
{memory.report_section(memory.timelines(db.experiment.path))}
<script type="application/json" id="report-data">{data}</script>
<script>{_JS}</script>
</body></html>
"""


def write_html(
    db: Database, views: View | dict[str, View], out: TextIO, lines: int | None = HTML_LINES
) -> None:
    """Write the report of one top-down view, or of :func:`report_views`' three."""
    if isinstance(views, View):
        out.write(render_html(db, views, lines=lines))
        return
    others = [v for kind, v in views.items() if kind != "top-down"]
    out.write(render_html(db, views["top-down"], others, lines))
