"""The self-contained HTML report, checked as a file and in headless Chromium.

The browser tests carry the ``browser`` marker: they need Chromium (``apt-get install -y
chromium``) and fail, never skip, when it is missing. A small harness is injected around the
report: before it, a script that records every error and ``console.error``; after it, a script
that clicks the first collapsed toggle, counts the visible rows and reads the first rows' text.
Chromium's ``--dump-dom`` gives back the page after the scripts ran.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli.pyrun import main as pyrun
from pyhpctk.cli.pyview import main
from pyhpctk.present import open_database
from pyhpctk.present.api import Database
from pyhpctk.present.condense import condense
from pyhpctk.present.html import render_html, report_data
from pyhpctk.present.render import TEXT_DEPTH_LIMIT
from pyhpctk.present.synthetic import Spec, build
from pyhpctk.present.traces import summarize

CPU = "CPUTIME (sec)"

BEFORE = (
    "<script>window.__errors=[];"
    'window.addEventListener("error",function(e){window.__errors.push(String(e.message));});'
    "var __ce=console.error;console.error=function(){"
    'window.__errors.push(Array.prototype.join.call(arguments," "));};</script>'
)
AFTER = r"""<script>
(function () {
  var out = {};
  try {
    var rows = document.querySelectorAll("#tree-body tr[data-id]");
    var isShown = function (r) { return r.style.display !== "none"; };
    var visible = function () {
      return Array.prototype.filter.call(rows, function (r) { return r.style.display !== "none"; })
        .length;
    };
    out.rows = rows.length;
    out.before = visible();
    var toggles = Array.prototype.filter.call(
      document.querySelectorAll("#tree-body .toggle"),
      function (t) {
        return t.textContent === "\u25B8" && t.closest("tr").style.display !== "none";
      });
    out.collapsed = toggles.length;
    if (toggles.length) {
      var id = Number(toggles[0].closest("tr").dataset.id);
      toggles[0].click();
      out.after = visible();
      out.opened = id;
      toggles[0].click();
      out.again = visible();
    }
    var scope = function (r) { return r.querySelector("td.scope").textContent; };
    // The first screen: each visible row as [row, id, text], or [more, its parent's id, text].
    out.screen = Array.prototype.filter.call(document.querySelectorAll("#tree-body tr"), isShown)
      .map(function (r) {
        return r.dataset.id !== undefined ? ["row", Number(r.dataset.id), scope(r)]
                                          : ["more", Number(r.dataset.parent), scope(r)];
      });
    var firstMore = Array.prototype.filter.call(document.querySelectorAll("#tree-body tr.more"),
                                                isShown)[0];
    if (firstMore) {
      firstMore.click();  // its rows take its place
      out.moreOpened = [Number(firstMore.dataset.parent), visible(), isShown(firstMore)];
    }
    out.scopes = Array.prototype.slice.call(rows, 0, 50).map(scope);
    out.last = rows.length ? scope(rows[rows.length - 1]) : null;
    out.flame = document.querySelectorAll("#flame .fl").length;
    out.lanes = document.querySelectorAll("#timeline canvas").length;
    out.axis = document.querySelectorAll("#timeaxis canvas").length;
    out.legend = Array.prototype.map.call(document.querySelectorAll("#legend span"),
                                          function (s) { return s.textContent; });
    out.ready = document.body.dataset.ready || null;
    out.warpLanes = Array.prototype.map.call(document.querySelectorAll("#warps .lane"),
                                             function (e) { return e.textContent; });
    out.warpCanvases = document.querySelectorAll("#warps canvas").length;
    out.warpSummary = (document.getElementById("warp-summary") || {}).textContent || "";
    out.warpsShown = document.getElementById("warps").parentNode.style.display !== "none";
    // The views' tabs (top-down, bottom-up, flat): each shows its own table, whose rows fold.
    out.tabs = {};
    Array.prototype.forEach.call(document.querySelectorAll("#tabs .tab"), function (b) {
      b.click();
      var id = b.dataset.view === "top-down" ? "tree" : "view-" + b.dataset.view;
      var table = document.getElementById(id);
      var trs = table.querySelectorAll("tbody tr[data-id]");
      var seen = function () {
        return Array.prototype.filter.call(trs, function (r) { return r.style.display !== "none"; })
          .length;
      };
      var shut = Array.prototype.filter.call(table.querySelectorAll(".toggle"), function (t) {
        return t.textContent === "\u25B8" && t.closest("tr").style.display !== "none";
      });
      var info = {rows: trs.length, shown: table.style.display !== "none", before: seen(),
                  first: trs.length > 1 ? scope(trs[1]) : null,
                  others: document.querySelectorAll("#views table").length};
      if (shut.length) { shut[0].click(); info.after = seen(); }
      out.tabs[b.dataset.view] = info;
    });
    // Everything can be reached: click "smaller rows" rows and folded toggles until none is left.
    for (var round = 0; window.__openAll && round < 100000; round++) {
      var next = Array.prototype.filter.call(
        document.querySelectorAll("#tree-body tr.more, #tree-body .toggle"), function (e) {
          var r = e.closest("tr");
          return isShown(r) && (e.tagName === "TR" || e.textContent === "\u25B8");
        })[0];
      if (!next) { break; }
      next.click();
    }
    out.reachable = visible();
  } catch (e) { window.__errors.push("harness: " + e); }
  out.errors = window.__errors;
  // Chromium's --dump-dom dies (SIGILL) serialising a text node that holds a lone surrogate
  // (a name that was not UTF-8): the page is measured, so leave only the harness to dump.
  Array.prototype.forEach.call(document.querySelectorAll("header, section"), function (e) {
    e.remove();
  });
  var pre = document.createElement("pre");
  pre.id = "harness";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("the browser tests need Chromium: apt-get install -y chromium (marker: browser)")


def run_in_browser(page: str, tmp_path: Path, open_all: bool = False) -> dict[str, Any]:
    """What the harness saw; ``open_all``: it also opens every row it can, by clicks."""
    html_file = tmp_path / "page.html"
    before = BEFORE + ("<script>window.__openAll=true;</script>" if open_all else "")
    html_file.write_text(
        page.replace("<head>", "<head>" + before, 1).replace("</body>", AFTER + "</body>", 1),
        encoding="utf-8",
    )
    result = subprocess.run(
        [
            browser(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            html_file.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    found = re.search(r'<pre id="harness">(.*?)</pre>', result.stdout, re.S)
    assert found, f"the page did not run: {result.stderr[-2000:]}"
    data: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return data


def report(reference: Path, name: str) -> tuple[str, int]:
    db = open_database(reference / "dbase" / name)
    view = db.view("top-down")
    return render_html(db, view), sum(1 for _ in view.root.walk())


def test_report_is_self_contained(reference: Path) -> None:
    page, _ = report(reference, "loops-cputime-t.d")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "http://" not in page and "https://" not in page
    assert "<link" not in page and "@import" not in page
    embedded = re.search(r'id="report-data">(.*?)</script>', page, re.S)
    assert embedded is not None
    data = json.loads(embedded.group(1))
    assert data["tree"]["nodes"][0]["l"] == "testmeas-loops"
    assert len(data["timeline"]["rows"]) == 4


def test_report_escapes_script_endings(reference: Path) -> None:
    db = open_database(reference / "dbase" / "small.d")
    view = db.view("top-down")
    view.root.label = "</script><b>x"
    page = render_html(db, view)
    assert page.count("</script>") == 2  # the data block and the code block, nothing else


def test_cli_writes_the_report(reference: Path, tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    assert main([str(reference / "dbase" / "small.d"), "--html", str(target)]) == 0
    assert target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


@pytest.mark.browser
@pytest.mark.parametrize("name", ["loops-cputime-t.d", "loops-cuda-nvidiapc-t.d", "small.d"])
def test_report_renders_and_expands_in_chromium(reference: Path, tmp_path: Path, name: str) -> None:
    page, n_rows = report(reference, name)
    result = run_in_browser(page, tmp_path)
    assert result["errors"] == []
    assert result["ready"] == "yes"
    assert result["rows"] == n_rows
    assert result["flame"] > 0
    assert result["lanes"] == (4 if name == "loops-cputime-t.d" else 1 if name == "small.d" else 2)
    if result["collapsed"]:
        assert result["after"] > result["before"]  # the click expanded the tree
        assert result["again"] == result["before"]  # and a second click folded it back


@pytest.mark.browser
def test_browser_harness_catches_script_errors(reference: Path, tmp_path: Path) -> None:
    page, _ = report(reference, "small.d")
    broken = page.replace('"use strict";', '"use strict"; console.error("boom"); nosuch();', 1)
    result = run_in_browser(broken, tmp_path)
    assert "boom" in result["errors"]
    assert any("nosuch" in e for e in result["errors"])
    assert result["ready"] is None


def test_huge_trees_are_cut_for_the_report(
    reference: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyhpctk.present import html as report

    db = open_database(reference / "dbase" / "loops-cputime-t.d")
    full = sum(1 for _ in db.view("top-down").root.walk())
    monkeypatch.setattr(report, "LARGE_TREE_ROWS", 20)
    view = report.report_view(db, None, None, None, 0.0, False)
    rows = sum(1 for _ in view.root.walk())
    assert rows < full
    assert "small scopes hidden)" in render_html(db, view)
    chosen = report.report_view(db, None, None, None, 0.5, False)  # the user's threshold wins
    assert sum(1 for _ in chosen.root.walk()) > rows


# Names a measurement can hold, each able to break a page that embeds them carelessly: markup,
# a comment opener that hides the end of the data's <script> element, entity text, quotes,
# backslashes, the JavaScript line separators and a byte that was not UTF-8 (a lone surrogate).
HOSTILE = (
    "<!--<script>",
    "</script><b>bold</b>",
    "<![CDATA[ ]]>",
    "a&amp;b & c &lt;",
    "\"double\" 'single'",
    "back\\slash\\",
    "line\u2028sep\u2029end",
    "caf\udce9",
)


def hostile_report() -> tuple[str, Database]:
    calls = tuple(
        Spec("function", name=name, file="h.py", line=k, values={CPU: (float(k + 1),)})
        for k, name in enumerate(HOSTILE)
    )
    main = Spec("function", name="main", file="h.py", line=1, children=calls)
    exp = build([Spec("entry", name="main thread", children=(main,))], [CPU], [(("THREAD", 0),)])
    db = Database(exp)
    return render_html(db, db.view("top-down")), db


def test_report_data_holds_no_markup_characters() -> None:
    page, _ = hostile_report()
    embedded = re.search(r'id="report-data">(.*?)</script>', page, re.S)
    assert embedded is not None
    assert not set("<>&") & set(embedded.group(1))
    names = {n["l"] for n in json.loads(embedded.group(1))["tree"]["nodes"]}
    assert set(HOSTILE) <= names  # JSON.parse gives every name back as it was
    page.encode("utf-8")  # the whole page can be written as UTF-8


@pytest.mark.browser
def test_hostile_names_render_as_text_in_chromium(tmp_path: Path) -> None:
    page, db = hostile_report()
    result = run_in_browser(page, tmp_path)
    assert result["errors"] == [] and result["ready"] == "yes"
    assert result["rows"] == sum(1 for _ in db.view("top-down").root.walk())
    shown = {s.lstrip("\u25be\u25b8") for s in result["scopes"]}
    assert set(HOSTILE) <= shown, set(HOSTILE) - shown


@pytest.mark.browser
def test_deep_report_renders_in_chromium(tmp_path: Path) -> None:
    # 2,000 recursive calls: 4,003 rows. The flame graph used to recurse once per level and
    # overflowed the browser's stack near 2,300 levels; rows were indented 16 px per level.
    node = Spec("line", file="r.py", line=9, values={CPU: (1.0,)})
    for _ in range(2000):
        node = Spec(
            "function",
            name="rec",
            file="r.py",
            line=1,
            children=(Spec("line", file="r.py", line=2, children=(node,)),),
        )
    exp = build([Spec("entry", name="main thread", children=(node,))], [CPU], [(("THREAD", 0),)])
    db = Database(exp)
    view = db.view("top-down")
    result = run_in_browser(render_html(db, view), tmp_path)
    assert result["errors"] == [] and result["ready"] == "yes"
    assert result["rows"] == exp.tree.size and result["flame"] == exp.tree.size
    assert result["last"] == f"[depth {exp.tree.size - 1}] r.py: 9"
    assert result["scopes"][TEXT_DEPTH_LIMIT].lstrip("\u25be\u25b8") == "rec"  # depth 40: indented


@pytest.mark.browser
def test_report_offers_bottom_up_and_flat_views_in_chromium(
    reference: Path, tmp_path: Path
) -> None:
    target = tmp_path / "report.html"
    # Three lines: the views of small.d would fit in a screen whole, with nothing folded.
    assert main([str(reference / "dbase" / "small.d"), "--lines", "3", "--html", str(target)]) == 0
    result = run_in_browser(target.read_text(encoding="utf-8"), tmp_path)
    assert result["errors"] == [] and result["ready"] == "yes"
    db = open_database(reference / "dbase" / "small.d")
    tabs = result["tabs"]
    assert sorted(tabs) == ["bottom-up", "flat", "top-down"]
    for kind in ("bottom-up", "flat"):
        tab, view = tabs[kind], condense(db.view(kind))  # as the screen shows it
        assert tab["shown"] and tab["others"] == 3
        assert tab["rows"] == sum(1 for _ in view.root.walk())
        assert tab["first"].lstrip("\u25be\u25b8") == view.root.children[0].label
        assert tab["after"] > tab["before"]  # a folded row opens


QUIET = """\
import threading, time

def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

def hot():
    burn(0.8)

helpers = [threading.Thread(target=burn, args=(0.002,)) for _ in range(6)]
for thread in helpers:
    thread.start()
hot()
for thread in helpers:
    thread.join()
"""


@pytest.fixture(scope="module")
def quiet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A traced program: the main thread busy 0.8 s, six helper threads 2 ms each."""
    where = tmp_path_factory.mktemp("quiet")
    (where / "quiet.py").write_text(QUIET)
    assert pyrun(["-t", "-o", str(where / "m"), sys.executable, str(where / "quiet.py")]) == 0
    run(ProfOptions.build([where / "m"], output=where / "db"))
    return where / "db"


def test_timeline_folds_quiet_threads_and_names_the_top_functions(quiet: Path) -> None:
    # Before (issue #36 item 7): a lane per thread (seven here, six of them empty strips), a
    # legend of every function, one entry per native address, and no time axis.
    db = open_database(quiet)
    timeline = report_data(db, db.view("top-down"))["timeline"]
    lines = db.experiment.traces.lines()
    assert len(lines) == 7
    assert [row["name"] for row in timeline["rows"][1:]] == [
        "6 quiet threads (each < 1% of the busiest's CPU time)"
    ]
    assert len(timeline["rows"]) == 2
    sampled = [x.timestamps for x in lines if len(x.timestamps)]
    span = max(int(t[-1]) for t in sampled) - min(int(t[0]) for t in sampled)
    assert timeline["seconds"] == pytest.approx(span / 1e9)
    assert 0.8 <= timeline["seconds"] < 60
    # The legend: the functions holding most sampled time, a native library once.
    held: dict[str, int] = {}
    for summary in summarize(db.experiment, top=1000):
        for name, ns in summary.top:
            name = re.sub(r"\+0x[0-9a-f]+( \[.+\])$", r"\1", name)  # sym+0xa0 [lib]
            name = re.sub(r"\+0x[0-9a-f]+$", " (native)", name)  # lib+0xcf438
            name = re.sub(r"^(\S+) @ 0x[0-9a-f]+$", r"\1 (native)", name)  # libc.so.6 @ 0x85e50
            held[name] = held.get(name, 0) + ns
    legend = timeline["legend"]
    assert 0 < len(legend) <= 10
    assert legend[0] == max(held, key=lambda name: held[name])
    assert not any("+0x" in name for name in legend)
    slots = {name: timeline["slot"][i] for i, name in enumerate(timeline["names"])}
    assert [slots[name] for name in legend] == list(range(len(legend)))
    assert all(slots[name] == -1 for name in slots if name not in legend)


@pytest.mark.browser
def test_timeline_has_a_time_axis_and_a_legend_in_chromium(quiet: Path, tmp_path: Path) -> None:
    db = open_database(quiet)
    timeline = report_data(db, db.view("top-down"))["timeline"]
    result = run_in_browser(render_html(db, db.view("top-down")), tmp_path)
    assert result["errors"] == [] and result["ready"] == "yes"
    assert result["axis"] == 1 and result["lanes"] == 2
    others = len(timeline["names"]) > len(timeline["legend"])
    assert result["legend"] == timeline["legend"] + (["other"] if others else [])


def text_screen(capsys: pytest.CaptureFixture[str], database: Path, lines: int) -> list[str]:
    """The scopes ``pyview --lines N`` prints, top to bottom, without marks or counts."""
    assert main([str(database), "--lines", str(lines), "--tree", "indent"]) == 0
    printed = capsys.readouterr().out.splitlines()
    header = next(k for k, line in enumerate(printed) if line.endswith("Scope"))
    column = printed[header].index("Scope")
    scopes = []
    for line in printed[header + 1 :]:
        if line.startswith(("... ", "hottest self: ")):
            break
        scope = line[column:].strip().removeprefix("* ")
        scopes.append(re.sub(r" \(\+\d+ hidden\)$", "", scope))
    return scopes


@pytest.mark.browser
def test_report_opens_what_the_text_screen_shows_in_chromium(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before (issue #36 item 1): every row on the hot path open with ALL its children shown, so
    # a library's 40 rows of 0.1 % pushed the rest of the program below the fold.
    database = reference / "dbase" / "loops-cputime-t.d"
    target = tmp_path / "report.html"
    assert main([str(database), "--lines", "16", "--html", str(target)]) == 0
    page = target.read_text(encoding="utf-8")
    result = run_in_browser(page, tmp_path, open_all=True)
    assert result["errors"] == [] and result["ready"] == "yes"
    screen = result["screen"]
    rows = [text.lstrip("\u25be\u25b8") for what, _, text in screen if what == "row"]
    more = [(parent, text) for what, parent, text in screen if what == "more"]
    assert len(screen) <= 1 + 16 and more  # the root, then 16 lines
    # The rows are those the text screen shows in as many rows, in its order.
    assert rows == text_screen(capsys, database, len(rows) - 1)
    # Each "smaller rows" row stands for its parent's children the screen leaves out: their
    # count and their share of the total, from the condensed tree as the screen builds it.
    nodes = json.loads(html.unescape(re.findall(r'id="report-data">(.*?)</script>', page)[0]))
    nodes = nodes["tree"]["nodes"]
    shown = {row for what, row, _ in screen if what == "row"}
    view = condense(open_database(database).view("top-down"))
    total = float(view.root.values[0])
    for parent, text in more:
        kept = {nodes[k]["l"] for k in shown if nodes[k]["p"] == parent}
        path = []
        while parent > 0:
            path.append(nodes[parent]["l"])
            parent = nodes[parent]["p"]
        node = view.root
        for label in reversed(path):
            node = next(c for c in node.children if c.label == label)
        cut = [c for c in node.children if c.label not in kept]
        assert 0 < len(cut) < len(node.children)
        share = 100.0 * sum(float(c.values[0]) for c in cut) / total
        plural = "s" if len(cut) > 1 else ""
        assert text == f"\u2026 {len(cut)} smaller row{plural} ({share:.1f} %)"
    # A click on one shows its rows in its place; every row can be reached by clicks.
    parent, after, still = result["moreOpened"]
    first = next(text for p, text in more if p == parent)
    assert after == len(rows) + int(re.findall(r"\d+", first)[0]) and not still
    assert result["reachable"] == result["rows"] == len(nodes)
